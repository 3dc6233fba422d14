"""`p3o eval` on a training run: the run's task, split, template, system prompt, fields, verifier and device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import p3o.rollout
from p3o.cli import main as p3o_main
from p3o.config import load_config, save_config
from p3o.eval.runner import find_run
from p3o.tasks import in_test_split
from p3o.types import Rollouts

DATA = Path(__file__).resolve().parents[1] / "data" / "own_task.jsonl"
ROWS = {r["q"]: r["a"] for r in map(json.loads, DATA.read_text().splitlines())}
SYSTEM = "You are a careful calculator."
loaded_models: list[str] = []  # the model names p3o eval asked load_policy for


class TextTokenizer:
    """Keeps every prompt text it encodes (ids are the text's index); no chat template: system + user as text."""

    chat_template = None
    texts: ClassVar[list[str]] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        TextTokenizer.texts.append(text)
        return {"input_ids": [len(TextTokenizer.texts) - 1]}


class EchoEngine:
    """Answers "RIGHT <answer>" for even problems, "wrong" otherwise; records its device."""

    made: ClassVar[list[EchoEngine]] = []

    def __init__(self, model: object, tokenizer: object = None, **kwargs: object) -> None:
        self.kwargs = kwargs
        EchoEngine.made.append(self)

    def generate(self, prompt_ids: list[list[int]], n: int, *, seed: int | None = None, answers: list) -> Rollouts:
        texts = [f"RIGHT {a}" if int(a) % 2 == 0 else "wrong" for a in answers for _ in range(n)]
        rows = len(texts)
        return Rollouts(
            prompt_ids=torch.ones(rows, 1, dtype=torch.long),
            prompt_mask=torch.ones(rows, 1, dtype=torch.bool),
            response_ids=torch.zeros(rows, 2, dtype=torch.long),
            mask=torch.ones(rows, 2, dtype=torch.bool),
            rollout_logp=torch.zeros(rows, 2),
            policy_version=torch.zeros(rows, 2, dtype=torch.long),
            group_ids=torch.arange(rows) // n,
            rewards=torch.zeros(rows),
            truncated=torch.zeros(rows, dtype=torch.bool),
            texts=texts,
            answers=[a for a in answers for _ in range(n)],
        )


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished run on the own-data file (config.yaml + final/), with a custom verifier; engine and model faked."""
    (tmp_path / "rewards_for_eval.py").write_text(
        "def right(completion, answer):\n    return float(completion == 'RIGHT ' + answer)\n"
    )
    cfg = load_config(
        [
            "--run_dir",
            str(tmp_path / "run"),
            "--task.name",
            str(DATA),
            "--task.question_key",
            "q",
            "--task.answer_key",
            "a",
            "--task.template",
            "short",
            "--task.system_prompt",
            SYSTEM,
            "--task.verifier",
            f"{tmp_path / 'rewards_for_eval.py'}:right",
            "--rollout.max_new_tokens",
            "21",
        ]
    )
    run = Path(cfg.run_dir)
    save_config(cfg, run / "config.yaml")
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")

    def fake_load_policy(name: str, **kwargs: object) -> tuple[torch.nn.Module, TextTokenizer]:
        loaded_models.append(name)
        return torch.nn.Linear(1, 1), TextTokenizer()

    monkeypatch.setattr("p3o.models.load_policy", fake_load_policy)
    monkeypatch.setattr(p3o.rollout, "HFEngine", EchoEngine)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # model.device auto -> cuda, as training picks
    TextTokenizer.texts.clear()
    EchoEngine.made.clear()
    loaded_models.clear()
    return run


@pytest.mark.parametrize("which", ["run", "final"])
def test_eval_on_a_run_uses_its_task_settings(run_dir: Path, which: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_dir / "eval.json"
    model = run_dir if which == "run" else run_dir / "final"
    assert p3o_main(["eval", "--model", str(model), "--n-samples", "2", "--k", "1,2", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert loaded_models == [str(run_dir / "final")]
    # held-out rows only: the question of every evaluated prompt is in the test split, and all of them are there
    questions = [t.split("\n")[1] for t in TextTokenizer.texts]
    assert questions and all(in_test_split(q, 0.1) for q in questions)
    assert sorted(questions) == sorted(q for q in ROWS if in_test_split(q, 0.1))
    # the run's system prompt and template (no chat template: the system prompt is prefixed)
    assert TextTokenizer.texts[0] == f"{SYSTEM}\n{questions[0]}\nAnswer with '#### <number>'.\n"
    # the run's verifier: only "RIGHT <answer>" scores, which the engine writes for even answers
    even = sum(int(ROWS[q]) % 2 == 0 for q in questions)
    assert d["correct"] == [2 if int(ROWS[q]) % 2 == 0 else 0 for q in questions]
    assert d["pass_at_k"]["1"] == pytest.approx(even / len(questions))
    assert EchoEngine.made[-1].kwargs["settings"].device == "cuda" and d["max_new_tokens"] == 21
    assert d["extra"]["run"] == str(run_dir) and d["split"] == d["extra"]["split"] == "test"
    assert d["extra"]["fields"] == {"question_key": "q", "answer_key": "a"}
    assert d["task"] == str(DATA) and d["extra"]["verifier"].endswith("rewards_for_eval.py:right")
    assert "p3o eval:" in capsys.readouterr().err


def test_command_line_overrides_the_run(run_dir: Path) -> None:
    out = run_dir / "eval.json"
    argv = ["eval", "--model", str(run_dir), "--n-samples", "1", "--k", "1", "--out", str(out), "--quiet"]
    extra = ["--template", "plain", "--system-prompt", "Be brief.", "--verifier", "exact-int", "--device", "cpu"]
    assert p3o_main([*argv, *extra, "--max-new-tokens", "9"]) == 0
    d = json.loads(out.read_text())
    assert TextTokenizer.texts[0].startswith("Be brief.\n") and "Answer with" not in TextTokenizer.texts[0]
    assert d["pass_at_k"]["1"] == 0.0  # exact-int wants "#### n": "RIGHT n" no longer scores
    assert EchoEngine.made[-1].kwargs["settings"].device == "cpu" and d["max_new_tokens"] == 9
    # --task names other evaluation data; --difficulty applies to the built-in task only
    assert p3o_main([*argv, "--task", "arithmetic", "--difficulty", "3", "--n-problems", "4"]) == 0
    d = json.loads(out.read_text())
    assert d["task"] == "arithmetic" and d["n_problems"] == 4 and d["extra"]["difficulty"] == 3
    assert p3o_main([*argv, "--difficulty", "3"]) == 2


def test_find_run(tmp_path: Path) -> None:
    run = tmp_path / "r"
    (run / "checkpoints" / "step_000002" / "policy").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "policy" / "config.json").write_text("{}")
    (run / "config.yaml").write_text("seed: 0\n")
    assert find_run(run / "checkpoints" / "step_000002") == (run / "checkpoints" / "step_000002" / "policy", run)
    assert find_run(tmp_path / "elsewhere") == (tmp_path / "elsewhere", None)
    assert find_run("tiny") == (Path("tiny"), None)
