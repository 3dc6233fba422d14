"""`p3o compare` end to end with the real trainer: 2 objectives × 1 regime × 1 seed × 2 steps on the tiny random
model, two `p3o train` processes at once, each run evaluated on the test split as it finishes, one report."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from p3o.cli import main as p3o_main


def test_tiny_compare_end_to_end(tmp_path: Path, capsys) -> None:
    raw = {
        "name": "tiny",
        "out_dir": str(tmp_path / "out"),
        "base": {
            "model.name": "tiny-random",
            "steps": 2,
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
            "update.micro_batch_size": 4,
            "log": {"progress": False, "plot": False, "tensorboard": False, "wandb": False},
            "ckpt.every": 0,
            "task.n_eval": 0,
        },
        "objectives": ["p3o", "grpo-0.2"],
        "regimes": ["on-policy"],
        "seeds": [0],
        "eval": {"n_samples": 2, "n_problems": 2},
        "claims": [
            {"id": "a", "title": "t", "kind": "tracks", "regimes": ["on-policy"], "objectives": ["p3o", "grpo-0.2"]}
        ],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert p3o_main(["compare", str(path), "--jobs", "2", "--exploratory"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    # Both evaluations ran (they are serialised: concurrent transformers loading is not thread-safe).
    assert out.count("; eval pass@1 ") == 2 and "[2/2]" in out, out
    for objective in ("p3o", "grpo-0.2"):
        run = tmp_path / "out" / "runs" / "on-policy" / objective / "seed0"
        assert (run / "DONE").is_file() and (run / "final").is_dir()
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["objective"]["name"] == objective.split("-")[0] and cfg["steps"] == 2
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
        ev = json.loads((run / "eval.json").read_text())
        assert ev["n_problems"] == 2 and ev["n_samples"] == 2 and 0.0 <= ev["pass_at_k"]["1"] <= 1.0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| p3o | 1/1 |" in report and "| grpo-0.2 | 1/1 |" in report and "runs with metrics: 2/2" in report
    assert "Policy size:" in report
    # Resumable: nothing is trained again.
    assert p3o_main(["compare", str(path), "--in-process", "--exploratory"]) == 0
    assert capsys.readouterr().out.count(": skipped") == 2
