"""Slow, obviously-correct per-token Python loops for every objective (the oracle of the vectorised code).

Each returns (loss, grad) where grad[i][t] = ∂loss/∂logp[i][t], written from the formulas in docs/objectives.md
with plain floats and the analytic per-token derivatives.
"""

from __future__ import annotations

import math


def ess(lrs: list[float]) -> float:
    if not lrs:
        return 1.0
    rho = [math.exp(x) for x in lrs]
    return sum(rho) ** 2 / (len(rho) * sum(r * r for r in rho))


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def agg_coef(mask: list[list[bool]], agg: str) -> list[list[float]]:
    """c[i][t] with loss = Σ c[i][t]·ℓ[i][t] for the aggregation mode (batch = this data, no step counts)."""
    n_rows, n_cols = len(mask), len(mask[0])
    total = sum(sum(r) for r in mask)
    out = []
    for row in mask:
        n_i = sum(row)
        if agg == "token-mean":
            c = 1 / max(total, 1)
        elif agg == "seq-mean-token-mean":
            c = 1 / (max(n_i, 1) * n_rows)
        else:
            c = 1 / (n_cols * n_rows)
        out.append([c if m else 0.0 for m in row])
    return out


def ppo_token(rho: float, a: float, lo: float, hi: float, dual: float | None = None) -> tuple[float, float]:
    """(−min(ρA, clip(ρ)A) [dual-clipped], ∂/∂lr) — the derivative w.r.t. log ρ is ρ·∂/∂ρ."""
    unclipped, clipped = -rho * a, -clip(rho, 1 - lo, 1 + hi) * a
    if unclipped >= clipped:
        val, d = unclipped, -rho * a
    else:
        val, d = clipped, (-rho * a if 1 - lo < rho < 1 + hi else 0.0)
    if dual is not None and a < 0 and -dual * a < val:
        val, d = -dual * a, 0.0
    return val, d


def kl_token(x: float, estimator: str) -> tuple[float, float]:
    """(k(x), dk/dx) of P3O's per-token KL estimators at lr = x."""
    if estimator == "k3":
        return math.exp(-x) + x - 1, 1 - math.exp(-x)
    if estimator == "k3_is":
        return math.exp(x) * x - math.exp(x) + 1, math.exp(x) * x
    if estimator == "k2":
        return 0.5 * x * x, x
    assert estimator == "none", estimator
    return 0.0, 0.0


def _gmpo(d: dict, coef: list[list[float]], lo: float, hi: float) -> tuple[float, list[list[float]]]:
    """GMPO per row: c̃ = min(c, ε_hi) for A > 0, max(c, −ε_lo) for A < 0, 0 for A = 0; R = exp(mean c̃);
    ℓ_i = −A_i·R_i written on each valid token (so the aggregation's per-token coefficients sum per row)."""
    logp, roll, mask, adv = d["logp"], d["rollout"], d["mask"], d["adv"]
    loss, grad = 0.0, [[0.0] * len(logp[0]) for _ in logp]
    for i, row in enumerate(logp):
        a = adv[i]
        ts = [t for t in range(len(row)) if mask[i][t]]
        cs, free = [], []
        for t in ts:
            c = row[t] - roll[i][t]
            if a > 0:
                cs.append(min(c, hi))
                free.append(c <= hi)
            elif a < 0:
                cs.append(max(c, -lo))
                free.append(c >= -lo)
            else:
                cs.append(0.0)
                free.append(False)
        r = math.exp(sum(cs) / len(ts))
        weight = sum(coef[i][t] for t in ts)
        loss += weight * -a * r
        for t, f in zip(ts, free):
            grad[i][t] = weight * -a * r / len(ts) if f else 0.0
    return loss, grad


def oracle(name: str, d: dict, **hp: float) -> tuple[float, list[list[float]]]:
    """Loss and gradient of objective ``name`` on the data dict d (lists: logp, rollout, prox, mask, adv)."""
    logp, roll, prox, mask, adv = d["logp"], d["rollout"], d["prox"], d["mask"], d["adv"]
    n_rows, n_cols = len(logp), len(logp[0])
    lr = [[logp[i][t] - roll[i][t] for t in range(n_cols)] for i in range(n_rows)]
    valid_lr = [lr[i][t] for i in range(n_rows) for t in range(n_cols) if mask[i][t]]
    aggs = dict.fromkeys(("grpo", "gspo", "gmpo", "sapo", "topr"), "seq-mean-token-mean")
    coef = agg_coef(mask, hp.get("agg", aggs.get(name, "token-mean")))
    if name == "m2po":  # brute force: drop the largest lr² one by one until the mean of the rest is < τ
        vals = sorted((x * x for x in valid_lr), reverse=True)
        k = 0
        while k < len(vals) and sum(vals[k:]) / len(vals[k:]) >= hp.get("tau", 0.04):
            k += 1
        cut = vals[k - 1] if k else math.inf
    if name == "m2po_clip":  # brute force: the largest harmful v whose cap keeps Σ min(v_i, cap) under τ·n
        harm = [
            lr[i][t] ** 2
            for i in range(n_rows)
            for t in range(n_cols)
            if mask[i][t] and ((adv[i] > 0 and lr[i][t] > 0) or (adv[i] < 0 and lr[i][t] < 0))
        ]
        tau = hp.get("tau", 0.04)
        if not harm or sum(harm) / len(harm) <= tau:
            lo_eps, hi_eps = 1.0, math.inf
        else:
            fits = [v for v in harm if sum(min(u, v) for u in harm) < tau * len(harm)]
            cap = math.sqrt(max(fits)) if fits else 0.0
            lo_eps = max(1 - math.exp(-cap), hp.get("floor_low", 0.3))
            hi_eps = max(math.exp(cap) - 1, hp.get("floor_high", 0.5))
    e_b = ess(valid_lr)
    if name == "p3o_two_anchor":
        e_p = ess([logp[i][t] - prox[i][t] for i in range(n_rows) for t in range(n_cols) if mask[i][t]])
    if name in ("kl_cov", "clip_cov"):  # Cov_t = (A − Ā)(logp − mean logp) over the valid tokens
        cells = [(i, t) for i in range(n_rows) for t in range(n_cols) if mask[i][t]]
        a_bar = sum(adv[i] for i, _ in cells) / len(cells)
        lp_bar = sum(logp[i][t] for i, t in cells) / len(cells)
        cov = {(i, t): (adv[i] - a_bar) * (logp[i][t] - lp_bar) for i, t in cells}
        if name == "kl_cov":
            k = max(1, int(len(cells) * hp.get("ratio", 2e-4)))
            chosen = set(sorted(cells, key=lambda c: -cov[c])[:k])
    if name == "gmpo":
        return _gmpo(d, coef, hp.get("clip_eps_low", 0.4), hp.get("clip_eps_high", 0.4))
    loss, grad = 0.0, [[0.0] * n_cols for _ in range(n_rows)]
    for i in range(n_rows):
        seq_sum = sum(lr[i][t] for t in range(n_cols) if mask[i][t])
        seq_lr = [lr[i][t] for t in range(n_cols) if mask[i][t]]
        seen_rho: list[float] = []  # the ratios of row i's valid tokens so far (MinPRO)
        for t in range(n_cols):
            if not mask[i][t]:
                continue
            rho, a, x = math.exp(lr[i][t]), adv[i], lr[i][t]
            if name == "p3o":
                if hp.get("cap", "ess") == "ess":
                    w = min(rho, e_b)
                else:  # the sign-following cut at ε: GRPO's unclipped tokens keep weight ρ
                    eps = hp.get("cap_eps", 0.2)
                    w = rho if (rho <= 1 + eps if a >= 0 else rho >= 1 - eps) else 0.0
                kl_val, kl_grad = kl_token(x, hp.get("kl_estimator", "k3"))
                val = -w * a * logp[i][t] + (1 - e_b) * kl_val
                g = -w * a + (1 - e_b) * kl_grad
            elif name == "p3o_two_anchor":
                rp = math.exp(logp[i][t] - prox[i][t])
                e_mix = min(e_b, e_p)
                w = min(rho, e_mix)
                if hp.get("variant", "sum") == "sum":
                    kl_b, kl_p = (1 / rho + x - 1), (1 / rp + math.log(rp) - 1)
                    val = -w * a * logp[i][t] + (1 - e_b) * kl_b + (1 - e_p) * kl_p
                    g = -w * a + (1 - e_b) * (1 - 1 / rho) + (1 - e_p) * (1 - 1 / rp)
                else:  # π_mix = (a_b·π_b + a_p·π_prox)/(a_b + a_p) for the sampled token; KL(π_θ‖π_mix) in k3 form
                    a_b, a_p = 1 - e_b, 1 - e_p
                    mix = (a_b * math.exp(roll[i][t]) + a_p * math.exp(prox[i][t])) / (a_b + a_p)
                    q = mix / math.exp(logp[i][t])  # π_mix / π_θ
                    val = -w * a * logp[i][t] + (1 - e_mix) * (q - math.log(q) - 1)
                    g = -w * a + (1 - e_mix) * (1 - q)
            elif name in ("grpo", "dapo"):
                eps = hp.get("clip_eps", 0.2)
                lo = hp.get("clip_eps_low", eps if name == "grpo" else 0.2)
                hi = hp.get("clip_eps_high", eps if name == "grpo" else 0.28)
                val, g = ppo_token(rho, a, lo, hi, hp.get("dual_clip"))
            elif name == "gspo":
                s = math.exp(sum(seq_lr) / len(seq_lr))
                val, g = ppo_token(s, a, hp.get("clip_eps_low", 3e-4), hp.get("clip_eps_high", 4e-4))
            elif name == "cispo":
                w = clip(rho, 1 - hp.get("trunc_eps_low", 1.0), 1 + hp.get("trunc_eps_high", 4.0))
                val, g = -w * a * logp[i][t], -w * a
            elif name == "decoupled_ppo":
                r = math.exp(logp[i][t] - prox[i][t])
                wb = math.exp(prox[i][t] - roll[i][t])
                cap = hp.get("weight_cap", 5.0)
                val, g = ppo_token(r, a, 0.2, 0.2)
                if wb > cap and hp.get("weight_mode", "mask") == "mask":
                    wb = 0.0
                wb = min(wb, cap)
                val, g = wb * val, wb * g
            elif name == "m2po":
                keep = x * x < cut
                val, g = (-rho * a, -rho * a) if keep else (0.0, 0.0)
            elif name == "m2po_clip":
                val, g = ppo_token(rho, a, lo_eps, hi_eps)
            elif name == "minpro":
                including = hp.get("prefix_scope", "preceding") == "including"
                seen = [*seen_rho, rho] if including else list(seen_rho)
                stat = hp.get("prefix_stat", "min")
                if not seen:
                    s_val = 1.0
                elif stat == "min":
                    s_val = min(seen)
                elif stat == "mean":
                    s_val = sum(seen) / len(seen)
                elif stat == "geomean":
                    s_val = math.prod(seen) ** (1 / len(seen))
                else:
                    s_val = math.prod(seen)
                raw = s_val if including else s_val * rho
                w = clip(raw, 1 - hp.get("trunc_eps_low", 1.0), 1 + hp.get("trunc_eps_high", 4.0))
                val, g = -w * a * logp[i][t], -w * a
                seen_rho.append(rho)
            elif name == "sapo":
                tau = hp.get("tau_pos", 1.0) if a > 0 else hp.get("tau_neg", 1.05)
                sig = 1 / (1 + math.exp(-tau * (rho - 1)))
                val, g = -sig * 4 / tau * a, -a * 4 * sig * (1 - sig) * rho
            elif name == "dppo":
                delta = math.exp(logp[i][t]) - math.exp(roll[i][t])
                masked = delta > hp.get("mask_high", 0.2) if a > 0 else delta < -hp.get("mask_low", 0.2)
                kl_tau, adv_tau = hp.get("kl_tau", 1e-3), hp.get("adv_tau", 1.0)
                pg = 0.0 if masked else -adv_tau * a * rho
                val, g = pg + kl_tau * x * x, pg + 2 * kl_tau * x
            elif name == "topr":
                c = 1.0 if a >= 0 else math.exp(min(0.0, seq_sum))
                val, g = -c * a * logp[i][t], -c * a
            elif name == "dro":
                beta = hp["beta"]
                val, g = -(a * logp[i][t] - 0.5 * beta * x * x), -(a - beta * x)
            elif name == "gpg":
                val, g = -a * logp[i][t], -a
            elif name == "kl_cov":
                beta = hp.get("beta", 0.1)
                val, g = -a * rho, -a * rho
                if (i, t) in chosen:
                    val, g = val + beta * abs(x), g + beta * math.copysign(1.0, x)
            elif name == "clip_cov":  # ratio 1: every band token is chosen (no randomness)
                val, g = ppo_token(rho, a, hp.get("clip_eps_low", 0.2), hp.get("clip_eps_high", 0.2))
                unclipped = -rho * a >= -clip(rho, 0.8, 1.2) * a
                if unclipped and hp["cov_low"] < cov[(i, t)] < hp.get("cov_high", 5.0):
                    val, g = 0.0, 0.0
            else:
                raise KeyError(name)
            loss += coef[i][t] * val
            grad[i][t] = coef[i][t] * g
    return loss, grad
