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
from p3o.eval.runner import evaluate, heldout_metrics, sample_batches
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
    assert engine.calls == [(2, 4), (2, 4), (1, 4)] and engine.kwargs["settings"].temperature == 0.7
    d = res.to_dict()
    assert d["pass_at_k"]["1"] == res.pass_at_k[1]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--model", "tiny-random", "--k", "1,x"], "--k"),
        (["--model", "tiny-random", "--n-samples", "2", "--k", "1,4"], r"--k: \[4\] exceed --n-samples 2"),
        (["--model", "tiny-random", "--n-samples", "0"], "n_samples: must be >= 1"),
        (["--mod", "tiny-random"], r"unknown key 'mod' \(did you mean 'model'\?\)"),  # no abbreviations
        (["--model", "tiny-random", "--top-p", "2"], "top_p: must be <= 1.0"),
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
    monkeypatch.setattr("p3o.tasks.sources.load_task", lambda *a, n=None, **kw: problems[:n])  # what p3o eval calls
    out, model = tmp_path / "e.json", tmp_path / "m"
    model.mkdir()  # a local model directory (the name check runs before load_policy)
    (model / "config.json").write_text("{}")
    argv = ["eval", "--model", str(model), "--n-samples", "4", "--k", "1,4", "--n-problems", "3", "--out", str(out)]
    assert p3o_main([*argv, "--quiet"]) == 0
    d = json.loads(out.read_text())
    assert d["n_problems"] == 3 and d["correct"] == CORRECT[:3] and d["model"] == str(model)
    assert d["pass_at_k"]["4"] == pytest.approx(2 / 3)


def test_sample_batches_seeds_are_a_function_of_the_batch_position() -> None:
    seen: list[int | None] = []

    class Recorder(ScriptedEngine):
        def generate(self, prompt_ids, n, *, seed=None, answers):  # type: ignore[override]
            seen.append(seed)
            return super().generate(prompt_ids, n, seed=seed, answers=answers)

    ids, answers = [[5]] * 5, ["0", "1", "2", "3", "4"]
    batches = list(sample_batches(Recorder(None), ids, answers, 2, batch_size=2, seed=10))
    assert [lo for lo, _ in batches] == [0, 2, 4] and seen == [10, 12, 14]
    assert [r.answers for _, r in batches][1] == ["2", "2", "3", "3"]  # rows grouped, answers set
    seen.clear()
    list(sample_batches(Recorder(None), ids, answers, 1, batch_size=2, batch_seed=lambda lo: 1000 + 7 * lo))
    assert seen == [1000, 1014, 1028]


def test_heldout_metrics_is_the_loops_eval_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    # eval_accuracy = share of samples with score > 0.5, eval_score = mean score; a 0.5 score is not correct
    monkeypatch.setattr(p3o.rollout, "HFEngine", ScriptedEngine)
    model, tok = torch.nn.Linear(2, 3), CharTokenizer()
    ids, answers = [[5]] * 5, [str(i) for i in range(5)]
    got = heldout_metrics(model, tok, ids, answers, "exact-int", n_samples=4, batch_size=2)
    assert got == pytest.approx({"eval_accuracy": sum(CORRECT) / 20, "eval_score": sum(CORRECT) / 20})
    # the same numbers through `evaluate` (one sampler, one verifier)
    problems = [Problem(prompt=f"q{i}", answer=str(i), meta={"verifier": "exact-int"}) for i in range(5)]
    assert evaluate(model, tok, problems, n_samples=4, ks=[1]).mean_reward == pytest.approx(got["eval_score"])

    def half(r: Rollouts) -> torch.Tensor:  # the loop's own reward_fn: a 0.5 score counts in eval_score only
        return torch.tensor([0.5 if "#### -1" in t else 1.0 for t in r.texts])

    made: list[object] = []

    def factory(policy: torch.nn.Module) -> ScriptedEngine:  # the loop's Components.make_engine
        made.append(policy)
        return ScriptedEngine(policy)

    got = heldout_metrics(model, None, ids, answers, half, n_samples=4, engine=factory, batch_seed=lambda lo: lo)
    assert made == [model]
    right = sum(CORRECT)
    assert got == pytest.approx({"eval_accuracy": right / 20, "eval_score": (right + 0.5 * (20 - right)) / 20})
    assert heldout_metrics(model, tok, [], [], "exact-int") == {}


class KeywordEnv:
    """An environment that remembers the keyword it was made with (`evaluate_episodes` must pass the run's)."""

    stop_strings = ()
    made: ClassVar[list[str]] = []

    def __init__(self, style: str = "default") -> None:
        self.style = style
        KeywordEnv.made.append(style)

    def reset(self, problem, seed):
        return [{"role": "user", "content": problem.prompt}]

    def step(self, turn):
        raise AssertionError("not stepped in this test")

    def close(self):
        pass


class _Stop(Exception):
    pass


def test_evaluate_episodes_makes_the_runs_environment_with_its_keywords(monkeypatch) -> None:
    """Issue 51 item 5: every episode's environment is made with the run's agent.env_kwargs (a run trained with
    style=qwen is not evaluated with the default parsing)."""
    import p3o.eval.runner as runner

    monkeypatch.setattr(runner, "make_engine", lambda *a, **k: object())
    monkeypatch.setattr(runner, "Renderer", lambda *a, **k: object())
    monkeypatch.setattr(runner, "stop_ids", lambda *a: [])
    monkeypatch.setattr(runner, "default_mode", lambda *a: "plain")

    def run_episodes(engine, make_env, problems, n, **kw):
        for _ in range(n):
            make_env().close()
        raise _Stop

    monkeypatch.setattr(runner, "run_episodes", run_episodes)
    KeywordEnv.made = []
    with pytest.raises(_Stop):
        runner.evaluate_episodes(
            None,
            type("Tok", (CharTokenizer,), {"eos_token_id": 2})(),
            [Problem("What is 2 + 2?", "4")],
            env=f"{Path(__file__).stem}:KeywordEnv",
            env_kwargs={"style": "qwen"},
            counting=runner.Counting(n_samples=3, ks=(1,)),
        )
    assert KeywordEnv.made == ["qwen"] * 4  # the probe and the 3 episodes
