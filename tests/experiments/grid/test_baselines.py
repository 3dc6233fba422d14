"""Baseline families: a claim against a declared family compares with every member (rule each) or with the member
that scored best on selection seeds disjoint from the test seeds (rule best)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from p3o.cli import main as p3o_main
from p3o.errors import ConfigError
from p3o.experiments.grid.spec import expand, parse_experiment

FAKE = " ".join([sys.executable, str(Path(__file__).parents[1] / "fake_train.py")])


def _raw(tmp_path: Path, rule: str, selection: list[int]) -> dict:
    member = {"objective.name": "grpo"}
    return {
        "name": "fam",
        "base": {"steps": 10},
        "objectives": [
            {"label": "p3o", "overrides": {"objective.name": "p3o", "fake.bonus": 0.03}},
            {"label": "grpo-a", "overrides": {**member, "fake.bonus": 0.0}},
            {"label": "grpo-b", "overrides": {**member, "fake.bonus": 0.02}},
            {"label": "grpo-c", "overrides": {**member, "fake.bonus": 0.01}},
        ],
        "regimes": ["on-policy"],
        "seeds": [0, 1, 2],
        "out_dir": str(tmp_path / "out"),
        "eval": {"n_samples": 0},
        "primary": {"metric": "final_reward", "margin": 0.001},
        "baselines": {
            "grpo-family": {"members": ["grpo-a", "grpo-b", "grpo-c"], "rule": rule, "selection_seeds": selection}
        },
        "claims": [
            {
                "id": "f",
                "title": "P3O beats the GRPO family",
                "kind": "better",
                "regimes": ["on-policy"],
                "objectives": ["p3o", "grpo-family"],
            }
        ],
    }


def _run(tmp_path: Path, raw: dict) -> list[dict]:
    path = tmp_path / "fam.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    report = tmp_path / "r.md"
    assert p3o_main(["compare", str(path), "--train-cmd", FAKE, "--report", str(report), "--exploratory"]) == 0
    return json.loads(report.with_suffix(".verdicts.json").read_text())["verdicts"]


def test_rule_each_tests_every_member_in_one_family(tmp_path: Path) -> None:
    verdicts = _run(tmp_path, _raw(tmp_path, "each", []))
    assert [v["b"] for v in verdicts] == ["grpo-a", "grpo-b", "grpo-c"]
    assert all(v["baseline"] == {"family": "grpo-family", "rule": "each"} for v in verdicts)
    # p3o's bonus 0.03·(1 + s/10) beats each member's by a seed-dependent amount: all supported, Holm over three.
    assert {v["verdict"] for v in verdicts} == {"supported"} and all(v["p_adj"] >= v["p_diff"] for v in verdicts)


def test_rule_best_picks_on_selection_seeds_and_tests_on_the_others(tmp_path: Path) -> None:
    raw = _raw(tmp_path, "best", [10, 11])
    exp = parse_experiment(raw)
    keys = {(r.objective, r.seed) for r in expand(exp)}
    assert {(m, s) for m in ("grpo-a", "grpo-b", "grpo-c") for s in (10, 11)} <= keys
    assert ("p3o", 10) not in keys  # only the family runs on the selection seeds
    verdicts = _run(tmp_path, raw)
    (v,) = verdicts
    assert v["b"] == "grpo-b" and v["baseline"]["selected"] == "grpo-b" and v["n"] == 3
    assert v["baseline"]["selection_seeds"] == [10, 11]
    means = v["baseline"]["selection_means"]
    assert means["grpo-b"] > means["grpo-c"] > means["grpo-a"]
    text = (tmp_path / "r.md").read_text()
    assert "best of `grpo-family` on selection seeds 10, 11" in text and "| grpo-b | 3/3 |" in text
    assert "| regime | p3o | grpo-a | grpo-b | grpo-c |" in text  # the claim's table lists the family's members


def test_selection_seeds_must_be_disjoint_from_test_seeds(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"selection_seeds: \[2\] are also test seeds"):
        parse_experiment(_raw(tmp_path, "best", [2, 10]))
    with pytest.raises(ConfigError, match="rule 'best' picks on selection_seeds"):
        parse_experiment(_raw(tmp_path, "best", []))
    bad = _raw(tmp_path, "each", [])
    bad["baselines"]["grpo-family"]["members"].append("nope")
    with pytest.raises(ConfigError, match="members"):
        parse_experiment(bad)
