"""`evaluate` plumbing with a scripted engine (exact pass@k, lengths, truncation) and `p3o eval` option errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import p3o.rollout
from p3o.cli import main as p3o_main
from p3o.eval.passk import pass_at_k
from p3o.eval.runner import evaluate
from p3o.tasks import Problem
from p3o.types import Rollouts


class CharTokenizer:
    """Characters as ids; no chat template (format_prompt then uses the plain text)."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(ch) % 250 + 3 for ch in text]}


class ScriptedEngine:
    """Problem i: its first CORRECT[i] samples are right; sample j has j + 1 tokens; the last one is truncated."""

    made: ClassVar[list[ScriptedEngine]] = []

    def __init__(self, model: object, tokenizer: object = None, **kwargs: object) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[int, int]] = []
        ScriptedEngine.made.append(self)

    def generate(
        self, prompt_ids: list[list[int]], n: int, *, seed: int | None = None, answers: list[str]
    ) -> Rollouts:
        self.calls.append((len(prompt_ids), n))
        texts, lens = [], []
        for answer in answers:
            good = CORRECT[int(answer)]
            texts += [f"so #### {answer}" if j < good else "#### -1" for j in range(n)]
            lens += [j + 1 for j in range(n)]
        rows, t = len(texts), max(lens)
        mask = torch.arange(t)[None, :] < torch.tensor(lens)[:, None]
        return Rollouts(
            prompt_ids=torch.ones(rows, 1, dtype=torch.long),
            prompt_mask=torch.ones(rows, 1, dtype=torch.bool),
            response_ids=torch.zeros(rows, t, dtype=torch.long),
            mask=mask,
            rollout_logp=torch.zeros(rows, t),
            policy_version=torch.zeros(rows, t, dtype=torch.long),
            group_ids=torch.arange(rows) // n,
            rewards=torch.zeros(rows),
            truncated=torch.tensor([j == n - 1 for _ in answers for j in range(n)]),
            texts=texts,
            answers=[a for a in answers for _ in range(n)],
        )


CORRECT = [0, 1, 3, 4, 2]  # problem i (answer "i") has CORRECT[i] correct samples out of 4


def test_evaluate_counts_per_problem_and_estimates_pass_at_k(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p3o.rollout, "HFEngine", ScriptedEngine)
    problems = [Problem(prompt=f"q{i}", answer=str(i), meta={"verifier": "exact-int"}) for i in range(5)]
    model = torch.nn.Linear(2, 3)  # only its parameter count is read: 2·3 + 3 = 9
    res = evaluate(model, CharTokenizer(), problems, n_samples=4, ks=[1, 2, 4, 8], batch_prompts=2, temperature=0.7)
    assert res.correct == CORRECT
    assert set(res.pass_at_k) == {1, 2, 4}  # k = 8 > n_samples is dropped
    for k in (1, 2, 4):
        assert res.pass_at_k[k] == pytest.approx(pass_at_k([4] * 5, CORRECT, k).mean())
    assert res.pass_at_k[1] == pytest.approx(sum(CORRECT) / 20)
    assert res.mean_reward == pytest.approx(sum(CORRECT) / 20)
    assert res.mean_response_len == pytest.approx(2.5)  # lengths 1, 2, 3, 4
    assert res.truncation_rate == pytest.approx(0.25)
    assert res.num_params == 9
    engine = ScriptedEngine.made[-1]
    assert engine.calls == [(2, 4), (2, 4), (1, 4)] and engine.kwargs["temperature"] == 0.7
    d = res.to_dict()
    assert d["pass_at_k"]["1"] == res.pass_at_k[1]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--model", "tiny-random", "--k", "1,x"], "--k"),
        (["--model", "tiny-random", "--n-samples", "2", "--k", "1,4"], r"--k: \[4\] exceed --n-samples 2"),
        (["--model", "tiny-random", "--n-samples", "0"], "--n-samples"),
        (["--model", "tiny-random", "--task", "gsm8k", "--difficulty", "2"], "--difficulty"),
        (["--n-samples", "2"], "--model"),
    ],
)
def test_eval_cli_bad_options_are_one_line(args: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert p3o_main(["eval", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(match, err), err


def test_eval_cli_writes_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setattr(p3o.rollout, "HFEngine", ScriptedEngine)
    problems = [Problem(prompt=f"q{i}", answer=str(i), meta={"verifier": "exact-int"}) for i in range(5)]
    monkeypatch.setattr(
        "p3o.models.load_policy", lambda name, **kw: (torch.nn.Linear(1, 1), CharTokenizer()), raising=False
    )
    monkeypatch.setattr("p3o.tasks.load_task", lambda *a, n=None, **kw: problems[:n])
    out = tmp_path / "e.json"
    argv = ["eval", "--model", "m", "--n-samples", "4", "--k", "1,4", "--n-problems", "3", "--out", str(out)]
    assert p3o_main([*argv, "--quiet"]) == 0
    d = json.loads(out.read_text())
    assert d["n_problems"] == 3 and d["correct"] == CORRECT[:3] and d["model"] == "m"
    assert d["pass_at_k"]["4"] == pytest.approx(2 / 3)
