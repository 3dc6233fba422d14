"""The results front page and the README verdict block are rendered from verdict files, never typed."""

from __future__ import annotations

import json
from pathlib import Path

from p3o.experiments.summary import END, START, main


def _verdicts(path: Path) -> Path:
    rec = {
        "claim": "a",
        "title": "P3O beats GRPO",
        "kind": "better",
        "regime": "stale-4",
        "a": "p3o",
        "b": "grpo",
        "metric": "final_reward",
        "n": 6,
        "diff": 0.0421,
        "ci": [0.01, 0.0742],
        "p_adj": 0.012,
        "identical": False,
        "verdict": "supported",
    }
    path.write_text(json.dumps([rec, {**rec, "claim": "b", "verdict": "inconclusive", "p_adj": float("nan")}]))
    return path


def test_page_and_readme_block(tmp_path: Path) -> None:
    v = _verdicts(tmp_path / "results-lm.verdicts.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nold text\n{END}\noutro\n")
    out = tmp_path / "results.md"
    assert main([str(v), "--out", str(out), "--readme", str(readme)]) == 0
    page = out.read_text()
    assert "[results-lm](results-lm.md)" in page and "1 supported, 0 contradicted, 1 inconclusive." in page
    assert "| +0.042 [+0.010, +0.074] | 0.012 | **supported** |" in page
    text = readme.read_text()
    assert text.startswith("intro\n" + START) and text.endswith(END + "\noutro\n") and "old text" not in text
    assert "- supported: P3O beats GRPO — stale-4, p3o − grpo on final_reward = +0.042 [+0.010, +0.074]" in text


def test_missing_markers_or_file_exit_2(tmp_path: Path) -> None:
    v = _verdicts(tmp_path / "x.verdicts.json")
    readme = tmp_path / "README.md"
    readme.write_text("no block\n")
    assert main([str(v), "--out", str(tmp_path / "r.md"), "--readme", str(readme)]) == 2
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "r.md")]) == 2
