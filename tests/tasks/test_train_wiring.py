"""`build_components` on your own file: held-out evaluation rows, field mapping, template, system prompt, verifier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from p3o.config import load_config
from p3o.errors import P3OError
from p3o.tasks import in_test_split
from p3o.train.wiring import build_components

DATA = Path(__file__).resolve().parents[1] / "data" / "own_task.jsonl"
OWN = ["--task.name", str(DATA), "--task.question_key", "q", "--task.answer_key", "a", "--model.name", "tiny-random"]


def _decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_own_file_trains_on_train_rows_and_evaluates_on_held_out_rows(tmp_path: Path) -> None:
    rewards = tmp_path / "my_reward.py"
    rewards.write_text("def last_number(completion, answer):\n    return float(completion.split()[-1] == answer)\n")
    cfg = load_config(
        [
            *OWN,
            "--task.template",
            "short",
            "--task.system_prompt",
            "You are a careful calculator.",
            "--task.verifier",
            f"{rewards}:last_number",
            "--model.device",
            "cpu",
        ]
    )
    comps = build_components(cfg)
    tok = comps.tokenizer
    train_text = [_decode(tok, p) for p in comps.prompts]
    eval_text = [_decode(tok, p) for p in comps.eval_prompts]
    assert len(train_text) + len(eval_text) == 200 and eval_text
    assert not set(train_text) & set(eval_text)
    question = eval_text[0].split("<|im_start|>user\n")[1].split("\nAnswer with")[0]
    assert in_test_split(question, 0.1)  # the evaluation prompt is a held-out row
    assert eval_text[0].startswith("<|im_start|>system\nYou are a careful calculator.<|im_end|>\n<|im_start|>user\n")
    assert eval_text[0].endswith("\nAnswer with '#### <number>'.<|im_end|>\n<|im_start|>assistant\n")
    batch = SimpleNamespace(texts=["so 12", "so 13"], answers=["12", "12"])
    assert comps.reward_fn(batch).tolist() == [1.0, 0.0]  # the custom module:function verifier


def test_own_file_default_template_follows_the_solutions() -> None:
    cfg = load_config([*OWN, "--task.solution_key", "work", "--task.n_eval", "0", "--model.device", "cpu"])
    comps = build_components(cfg)
    text = _decode(comps.tokenizer, comps.prompts[0])
    assert "Write the final answer as '#### <number>'." in text and "<|im_start|>system" not in text
    assert comps.eval_prompts == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--task.verifier", "no_such_module_p3o:fn"], r"^task\.verifier: verifier 'no_such_module_p3o:fn': cannot"),
        (["--task.question_key", "question"], r"own_task\.jsonl: line 1: missing field 'question'"),
        (["--task.test_fraction", "0"], r"task\.test_fraction=0\.0 held out no row"),
    ],
)
def test_bad_task_settings_fail_before_the_model_loads(args: list[str], match: str, monkeypatch) -> None:
    monkeypatch.setattr("p3o.models.load_policy", lambda *a, **k: pytest.fail("model loaded before the task"))
    with pytest.raises(P3OError, match=match):
        build_components(load_config([*OWN, *args]))
