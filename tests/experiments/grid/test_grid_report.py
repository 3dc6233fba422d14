"""Report aggregation on synthetic run directories: tables, pass@1 from eval.json, claim verdicts, figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from p3o.experiments.grid.collect import collect
from p3o.experiments.grid.report import claim_verdict, grid_decisions, regime_table, write_report
from p3o.experiments.grid.spec import expand, parse_experiment

# Final rewards chosen per (objective, seed): p3o and grpo agree within noise; cispo is clearly lower.
FINAL = {"p3o": [0.60, 0.62, 0.64], "grpo": [0.61, 0.63, 0.59], "cispo": [0.30, 0.32, 0.31]}


def make_grid(tmp_path: Path) -> object:
    raw = {
        "name": "syn",
        "objectives": ["p3o", "grpo", "cispo"],
        "regimes": ["on-policy"],
        "seeds": 3,
        "out_dir": str(tmp_path / "out"),
        "analysis": {"smooth": 1, "final_frac": 0.25},
        "claims": [
            {
                "id": "a",
                "title": "tracks",
                "kind": "tracks",
                "regimes": ["on-policy"],
                "objectives": ["p3o", "grpo"],
                "margin": 0.2,
            },
            {"id": "b", "title": "apart", "kind": "better", "regimes": ["on-policy"], "objectives": ["p3o", "cispo"]},
            {"id": "c", "title": "close", "kind": "better", "regimes": ["on-policy"], "objectives": ["p3o", "grpo"]},
            {
                "id": "d",
                "title": "rank",
                "kind": "rank",
                "regimes": ["on-policy"],
                "objectives": ["cispo", "grpo", "p3o"],
                "expected": ["p3o"],
            },
            {
                "id": "s",
                "title": "spread",
                "kind": "spread",
                "regimes": ["on-policy"],
                "objectives": ["grpo", "cispo"],
                "reference": ["p3o"],
            },
        ],
    }
    exp = parse_experiment(raw)
    for spec in expand(exp):
        spec.run_dir.mkdir(parents=True)
        final = FINAL[spec.objective][spec.seed]
        # 8 steps: a ramp, then the last 2 steps (final_frac 0.25) both at `final`.
        rewards = [*np.linspace(0.0, final, 6).tolist(), final, final]
        with open(spec.run_dir / "metrics.jsonl", "w") as f:
            for step, r in enumerate(rewards, start=1):
                row = {"step": step, "reward_mean": r, "ess": 0.9, "time_s": 2.0 * step}
                if spec.objective == "p3o":
                    row["kl_weight"] = 0.1
                f.write(json.dumps(row) + "\n")
        (spec.run_dir / "eval.json").write_text(json.dumps({"pass_at_k": {"1": final / 2, "2": final}}))
        (spec.run_dir / "config.yaml").write_text("steps: 8\nmodel:\n  name: tiny\n")
    return exp


def test_tables_aggregate_over_seeds(tmp_path: Path) -> None:
    summary = collect(make_grid(tmp_path))
    mean, std, n = summary.stat("on-policy", "p3o", "final_reward")
    assert (mean, n) == (pytest.approx(0.62), 3) and std == pytest.approx(0.02)
    assert summary.stat("on-policy", "cispo", "pass@1")[0] == pytest.approx(0.155)
    table = regime_table(summary, "on-policy")
    # p3o: final 0.620 ± 0.020, pass@1 = final/2 → 0.310 ± 0.010, KL weight 0.1, time_s of the last step 16 s
    assert "| p3o | 3/3 | 0.620 ± 0.020 | 0.620 ± 0.020 | 0.310 ± 0.010 | 0.900 ± 0.000 |" in table  # peak = final
    assert table.splitlines()[2].endswith("| 0.100 ± 0.000 | 0/3 | 16 |")
    assert "| grpo | 3/3 | 0.610 ± 0.020 |" in table and "| – | 0/3 | 16 |" in table  # grpo: no KL weight


def test_claim_verdicts_follow_the_numbers(tmp_path: Path) -> None:
    exp = make_grid(tmp_path)
    summary = collect(exp)
    by_id = {c.id: claim_verdict(summary, c)[0] for c in exp.claims if c.kind in ("rank", "spread")}
    decisions = {d.claim.id: d for d in grid_decisions(summary)}
    # a: paired diffs (−0.01, −0.01, +0.05): mean 0.01, within δ = 0.2 by TOST
    assert decisions["a"].result.diff == pytest.approx(0.01) and decisions["a"].verdict == "supported"
    # b: diffs (0.30, 0.30, 0.33), t ≈ 31 on 2 df; c: the noisy +0.01 is inconclusive after Holm
    assert decisions["b"].result.diff == pytest.approx(0.31) and decisions["b"].verdict == "supported"
    assert decisions["c"].verdict == "inconclusive"
    ps = [decisions[k].p_adj for k in "abc"]
    # c's estimate is inside its margin: it enters the family with its TOST p (amendment negligible-holm-tost)
    assert all(0 <= p <= 1 for p in ps) and decisions["c"].p_adj >= decisions["c"].result.p_equiv
    assert "p3o 0.620 > grpo 0.610 > cispo 0.310" in by_id["d"] and "p3o is the best" in by_id["d"]
    assert "within 2·SE" in by_id["d"]  # p3o vs grpo is not a significant gap
    assert "spans 0.300" in by_id["s"] and "p3o 0.620 is above every setting" in by_id["s"]


def test_write_report_links_figures_relative_to_report(tmp_path: Path) -> None:
    exp = make_grid(tmp_path)
    report = write_report(collect(exp), tmp_path / "docs" / "results.md", command="p3o compare syn.yaml")
    text = report.read_text()
    assert text.startswith("# Experiment `syn`\n\nGenerated by `p3o compare syn.yaml`")
    assert "![on-policy](figures/syn-on-policy.png)" in text
    assert (tmp_path / "docs/figures/syn-on-policy.png").stat().st_size > 1000
    assert "`model.name=tiny`" in text and "`steps=8`" in text
    assert "runs with metrics: 9/9" in text
    assert "## Verdicts" in text and "Holm" in text and "**supported**" in text
    verdicts = json.loads((tmp_path / "docs" / "results.verdicts.json").read_text())["verdicts"]
    assert {v["claim"] for v in verdicts} == {"a", "b", "c"} and all("p_adj" in v for v in verdicts)


def test_missing_runs_are_listed_not_invented(tmp_path: Path) -> None:
    exp = make_grid(tmp_path)
    # Remove one seed's metrics: it is listed as missing and the stats use the other two.
    victim = next(s for s in expand(exp) if s.objective == "cispo" and s.seed == 2)
    (victim.run_dir / "metrics.jsonl").unlink()
    summary = collect(exp)
    assert summary.stat("on-policy", "cispo", "final_reward")[2] == 2
    text = write_report(summary, tmp_path / "r.md").read_text()
    assert "on-policy/cispo/seed2" in text and "| cispo | 2/3 |" in text


def test_calibration_table_pools_seeds(tmp_path: Path) -> None:
    from p3o.experiments.grid.report import calibration_table

    exp = make_grid(tmp_path)
    exp.calibration = "p3o"
    for spec in expand(exp):  # give p3o's runs an ESS dip on one step of seed 0
        if spec.objective == "p3o" and spec.seed == 0:
            path = spec.run_dir / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            rows[3]["ess"] = 0.5
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = calibration_table(collect(exp), "p3o")
    row = table.splitlines()[2]
    # 24 steps pooled: 23 at 0.9 and one at 0.5 → mean 0.8833, min 0.5
    assert row.startswith("| on-policy | 3 |") and "| 0.8833 |" in row and "| 0.5000 |" in row


def test_calibration_table_gives_the_gain_over_the_base_with_its_interval(tmp_path: Path) -> None:
    from p3o.experiments.grid.report import calibration_table

    exp = make_grid(tmp_path)
    exp.calibration = "p3o"
    (exp.out_dir / "base_eval.json").write_text(json.dumps({"pass_at_k": {"1": 0.2}, "n_problems": 8, "n_samples": 2}))
    row = calibration_table(collect(exp), "p3o").splitlines()[2]
    # p3o's pass@1 per seed 0.300, 0.310, 0.320 → Δ 0.100, 0.110, 0.120: mean 0.110, sd 0.010,
    # half-width t(0.975, 2) · 0.010 / √3 = 4.3027 · 0.005774 = 0.0248
    assert row.endswith("| 0.310 ± 0.010 | +0.110 ± 0.010 [+0.085, +0.135] |")
    from p3o.experiments.grid.report import seed_gains

    assert seed_gains(collect(exp), "p3o") == (
        "- **on-policy**, Δ pass@1 vs base by seed: 0: +0.100, 1: +0.110, 2: +0.120 (3/3 seeds ≥ +0.05)"
    )


def _with_evals(tmp_path: Path) -> object:
    """The synthetic grid with in-loop evaluations (step 0, 4, 8) and MinPRO's diagnostics on the cispo arm."""
    exp = make_grid(tmp_path)
    for spec in expand(exp):
        k = spec.seed
        lines = (spec.run_dir / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        rows.insert(0, {"step": 0, "eval_accuracy": 0.5})
        rows[4]["eval_accuracy"] = 0.6 + 0.01 * k  # step 4: the peak
        rows[8]["eval_accuracy"] = 0.4 + 0.01 * k  # step 8: the final one
        for row in rows[1:]:
            row["offpolicy/m_mean"] = 0.8
            if spec.objective == "cispo":
                row.update({"m_mean": 0.3, "m_median": 0.25, "m_frac_above_0.5": 0.2, "m_frac_above_0.2": 0.6})
                row.update({f"weight_decile_{d}": 0.25 - 0.005 * d for d in range(10)})
        (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        done = {"started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2026-01-01T00:02:00+00:00", "wall_s": 120.0}
        (spec.run_dir / "DONE").write_text(json.dumps({**done, "cpu": "X (avx2)", "base_key": "tiny-b"}))
    return exp


def test_peak_and_final_are_reported_and_recorded(tmp_path: Path) -> None:
    from p3o.experiments.grid.report import peak_final_table, run_records

    summary = collect(_with_evals(tmp_path))
    run = summary.cell("on-policy", "p3o")[1]
    assert [st for st, _ in run.evals] == [0, 4, 8]
    assert [v for _, v in run.evals] == pytest.approx([0.5, 0.61, 0.41])
    assert run.metrics["eval_peak"] == pytest.approx(0.61) and run.metrics["eval_peak_step"] == 4.0
    assert run.metrics["eval_final"] == pytest.approx(0.41)
    table = peak_final_table(summary, "on-policy")
    # p3o pass@1 = final/2 (0.310 ± 0.010); in-loop final 0.41 ± 0.01, peak 0.61 ± 0.01, peak − final 0.2
    assert "| p3o | 3 | 0.310 ± 0.010 | 0.410 ± 0.010 | 0.610 ± 0.010 | 0.200 ± 0.000 | 4 |" in table
    assert "step 0, the starting policy, scores 0.500" in table
    records = run_records(summary)
    assert len(records) == 9
    rec = next(r for r in records if r["objective"] == "p3o" and r["seed"] == 1)
    assert rec["regime"] == "on-policy" and rec["started_at"] == "2026-01-01T00:00:00+00:00"
    assert rec["wall_s"] == 120.0 and rec["cpu"] == "X (avx2)" and rec["base_key"] == "tiny-b"
    assert [st for st, _ in rec["evals"]] == [0, 4, 8] and rec["eval_peak"] == pytest.approx(0.61)
    assert rec["pass@1"] == pytest.approx(0.31)
    # a peak can be a study's primary metric: paired by seed like any per-run summary key
    from p3o.experiments.grid.report import paired_values

    xa, xb, seeds = paired_values(summary, "on-policy", "p3o", "cispo", "eval_peak")
    assert xa == pytest.approx([0.60, 0.61, 0.62]) and xa == pytest.approx(xb) and seeds == [0, 1, 2]
    verdicts = json.loads(write_report(summary, tmp_path / "v" / "rep.md").with_suffix(".verdicts.json").read_text())
    assert len(verdicts["runs"]) == 9 and verdicts["runs"][0]["base_key"] == "tiny-b"
    assert all(v["seeds"] == [0, 1, 2] for v in verdicts["verdicts"] if v.get("seeds"))


def test_minpro_tables_seven_and_eight(tmp_path: Path) -> None:
    from p3o.experiments.grid.report import minpro_stats_tables

    summary = collect(_with_evals(tmp_path))
    text = minpro_stats_tables(summary, "on-policy")
    assert "| cispo | 0.800 | 0.300 | 0.250 | 0.200 | 0.600 | – | – |" in text  # the arm's own m_t
    assert "| p3o | 0.800 | – |" in text  # every arm: the data's m_t (the monitor's)
    assert "| cispo | 0.250 | 0.245 | 0.240 |" in text and "Table 8" in text
    # an arm of the paper's ablation (prefix_scope including) has no prefix factor: n/a, with the reason
    for spec in expand(summary.exp):
        if spec.objective == "cispo":
            (spec.run_dir / "config.yaml").write_text("objective:\n  name: minpro\n  prefix_scope: including\n")
    ablation = minpro_stats_tables(collect(summary.exp), "on-policy")
    assert "| cispo | 0.800 | n/a | n/a | n/a | n/a | n/a | n/a |" in ablation and "n/a: cispo weight" in ablation
    report = write_report(summary, tmp_path / "r" / "rep.md")
    body = report.read_text()
    assert "Peak and final held-out pass@1" in body and "tables 7 and 8" in body
    # runs without in-loop evaluations or MinPRO stats get neither section
    plain = collect(make_grid(tmp_path / "plain"))
    assert peak_or_empty(plain) == ("", "")


def peak_or_empty(summary: object) -> tuple[str, str]:
    from p3o.experiments.grid.report import minpro_stats_tables, peak_final_table

    return peak_final_table(summary, "on-policy"), minpro_stats_tables(summary, "on-policy")  # type: ignore[arg-type]


def test_a_stopped_study_decides_only_finished_arms(tmp_path: Path) -> None:
    from p3o.experiments.grid.report import unfinished_arms

    exp = make_grid(tmp_path)
    # the runner started cispo's seed 2 (its log exists) and was stopped: no DONE, no final/
    log = exp.out_dir / "logs" / "on-policy" / "cispo" / "seed2.log"
    log.parent.mkdir(parents=True)
    log.write_text("$ train ...\n")
    summary = collect(exp)
    assert len(summary.cell("on-policy", "cispo")) == 2  # the interrupted run is in no cell
    assert unfinished_arms(summary) == {"on-policy": ["cispo"]}
    decisions = grid_decisions(summary)
    assert {d.claim.id for d in decisions if d.role == "primary"} == {"a", "c"}
    body = write_report(summary, tmp_path / "r" / "rep.md").read_text()
    assert "(b) p3o vs cispo in on-policy: not run (unfinished arm: cispo)" in body
    # once it finishes (DONE), every claim is decided again
    (exp.out_dir / "runs" / "on-policy" / "cispo" / "seed2" / "DONE").write_text("{}")
    assert unfinished_arms(collect(exp)) == {}
