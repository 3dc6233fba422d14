"""Your own data: a hash held-out split of a single file, field mapping, eval data, templates, system prompt."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from p3o.errors import ConfigError, DataError
from p3o.tasks import Problem, format_prompt, in_test_split, load_eval_problems, load_task, load_train_problems
from p3o.tasks.prompts import TEMPLATES

DATA = Path(__file__).resolve().parents[1] / "data" / "own_task.jsonl"  # also the docs/tasks.md worked example
ROWS = [json.loads(line) for line in DATA.read_text().splitlines()]


def task(**kw: Any) -> SimpleNamespace:
    """A TaskConfig stand-in with the fields the task sources read (defaults as in p3o.config.TaskConfig)."""
    base = {
        "name": str(DATA),
        "difficulty": 2,
        "eval_name": None,
        "eval_split": "test",
        "test_fraction": 0.1,
        "allow_train_eval_overlap": False,
        "question_key": "q",
        "answer_key": "a",
        "solution_key": "work",
    }
    return SimpleNamespace(**{**base, **kw})


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_single_file_never_evaluates_on_its_training_rows(capsys: pytest.CaptureFixture[str]) -> None:
    train = load_train_problems(task(), seed=0)
    held = load_eval_problems(task(), seed=0, train=train)
    train_q, held_q = {p.prompt for p in train}, {p.prompt for p in held}
    assert not train_q & held_q
    assert train_q | held_q == {r["q"] for r in ROWS}  # every row is on exactly one side
    assert 5 <= len(held) <= 40  # ~10% of 200
    assert all(in_test_split(q, 0.1) for q in held_q) and not any(in_test_split(q, 0.1) for q in train_q)
    assert "warning" not in capsys.readouterr().err  # disjoint by construction: nothing to drop
    # the library call the old code got wrong: "test" of a single file is the held-out part, not the training rows
    fields = {"prompt": "q", "answer": "a"}
    assert {p.prompt for p in load_task(str(DATA), "test", fields=fields)} == held_q
    assert {p.prompt for p in load_task(str(DATA), "train", fields=fields)} == train_q
    assert len(load_task(str(DATA), "all", fields=fields)) == len(ROWS)


def test_split_is_a_function_of_the_question_only(tmp_path: Path) -> None:
    rows = list(ROWS)
    random.Random(3).shuffle(rows)
    rows = [{**r, "q": "  " + r["q"].upper() + " "} for r in rows]  # re-ordered, re-typed copy of the same data
    other = _jsonl(tmp_path / "copy.jsonl", rows)
    fields = {"prompt": "q", "answer": "a"}
    a = {p.answer + p.prompt.strip().lower() for p in load_task(str(DATA), "test", fields=fields)}
    b = {p.answer + p.prompt.strip().lower() for p in load_task(str(other), "test", fields=fields, seed=9)}
    assert a == b
    bigger = load_task(str(DATA), "test", fields=fields, test_fraction=0.5)
    assert {p.prompt for p in load_task(str(DATA), "test", fields=fields)} < {p.prompt for p in bigger}
    assert load_task(str(DATA), "test", fields=fields, test_fraction=0.0) == []
    with pytest.raises(ConfigError, match=r"task\.test_fraction"):
        load_task(str(DATA), "test", test_fraction=1.0)
    with pytest.raises(ConfigError, match=r"splits train, test, all .*not 'validation'"):
        load_task(str(DATA), "validation", fields=fields)


def test_field_mapping() -> None:
    train = load_train_problems(task(), seed=0, n=3)
    assert len(train) == 3
    row = next(r for r in ROWS if r["q"] == train[0].prompt)
    assert (train[0].answer, train[0].solution) == (row["a"], row["work"])
    with pytest.raises(DataError, match=r"own_task.jsonl: line 1: missing field 'question' .*task.question_key"):
        load_train_problems(task(question_key="question"), seed=0)
    with pytest.raises(DataError, match=r"line 1: missing field 'answer' .*task.answer_key"):
        load_train_problems(task(answer_key=None), seed=0)
    with pytest.raises(ConfigError, match=r"task\.question_key: the built-in 'arithmetic' task"):
        load_train_problems(task(name="arithmetic"), seed=0)


def test_folder_with_train_and_test_files(tmp_path: Path) -> None:
    _jsonl(tmp_path / "train.jsonl", [{"q": f"T{i}?", "a": str(i)} for i in range(6)])
    _jsonl(tmp_path / "test.jsonl", [{"q": f"E{i}?", "a": str(i)} for i in range(3)])
    cfg = task(name=str(tmp_path), solution_key=None)
    train = load_train_problems(cfg, seed=0)
    assert [p.prompt for p in train] == [f"T{i}?" for i in range(6)]  # the whole train file, no hash split
    assert [p.prompt for p in load_eval_problems(cfg, train=train)] == ["E0?", "E1?", "E2?"]


def test_explicit_eval_data_and_overlap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = load_train_problems(task(), seed=0)
    extra = _jsonl(tmp_path / "extra.jsonl", [{"q": "What is 40 + 2?", "a": "42"}, {"q": train[0].prompt, "a": "x"}])
    cfg = task(eval_name=str(extra), solution_key=None)
    held = load_eval_problems(cfg, train=train)  # a separate single file is used whole, minus training rows
    assert [p.prompt for p in held] == ["What is 40 + 2?"]
    err = capsys.readouterr().err
    assert "dropped 1 evaluation problems" in err and "task.allow_train_eval_overlap" in err
    kept = load_eval_problems(task(eval_name=str(extra), allow_train_eval_overlap=True), train=train)
    assert len(kept) == 2 and "also training problems" in capsys.readouterr().err
    only_train = _jsonl(tmp_path / "dup.jsonl", [{"q": train[1].prompt, "a": "1"}])
    with pytest.raises(ConfigError, match=r"every evaluation problem .* is also a training problem"):
        load_eval_problems(task(eval_name=str(only_train)), train=train)
    # the built-in task as evaluation data of a file-trained run, and an explicit split name
    arith = load_eval_problems(task(eval_name="arithmetic", question_key=None, answer_key=None), n=4, train=train)
    assert len(arith) == 4 and arith[0].meta["source"] == "arithmetic"


def test_overlap_only_with_the_explicit_flag(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = task(allow_train_eval_overlap=True)
    train = load_train_problems(cfg, seed=0)
    assert len(train) == len(ROWS)  # not split: the user asked to train and evaluate on the same rows
    held = load_eval_problems(cfg, n=10, train=train)
    assert len(held) == 10 and {p.prompt for p in held} <= {p.prompt for p in train}
    assert f"{len(ROWS)} of {len(ROWS)} evaluation problems" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"held out no row; raise it, set task.eval_name"):
        load_eval_problems(task(test_fraction=0.0), train=train)


# ------------------------------------------------------------------------------------------------ prompts

Q = Problem(prompt="What is 2 + 3?", answer="5", meta={"answer_format": "####"})
RENDERED = {  # docs/tasks.md shows these four
    "plain": "What is 2 + 3?",
    "hash": "What is 2 + 3?\nSolve step by step. Write the final answer as '#### <number>'.",
    "boxed": "What is 2 + 3?\nSolve step by step. Put the final answer in \\boxed{}.",
    "short": "What is 2 + 3?\nAnswer with '#### <number>'.",
}


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_templates_render(template: str) -> None:
    assert format_prompt(Q, None, template) == RENDERED[template] + "\n"
    assert format_prompt(Q, None, template, system="Be brief.") == "Be brief.\n" + RENDERED[template] + "\n"


def test_default_template_follows_the_answer_format() -> None:
    assert format_prompt(Q, None) == RENDERED["hash"] + "\n"
    boxed = Problem(prompt="What is 2 + 3?", answer="5", meta={"answer_format": "boxed"})
    assert format_prompt(boxed, None) == RENDERED["boxed"] + "\n"
    with pytest.raises(ConfigError, match="unknown template 'fancy'; known: default, plain, hash, boxed, short"):
        format_prompt(Q, None, "fancy")


def test_system_prompt_goes_through_the_chat_template() -> None:
    from p3o.models.tokenizer import train_tokenizer

    tok = train_tokenizer(["What is 2 + 3?\n#### 5"] * 4, vocab_size=300)
    text = format_prompt(Q, tok, "short", system="You are a careful calculator.")
    assert text == (
        "<|im_start|>system\nYou are a careful calculator.<|im_end|>\n"
        f"<|im_start|>user\n{RENDERED['short']}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert format_prompt(Q, tok, "short").startswith("<|im_start|>user\n")  # no system turn unless asked


def test_docs_worked_example_matches_the_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The `p3o train` command of docs/tasks.md parses, and its task and reward resolve as documented, in a directory
    where its first line (`p3o examples own-task`) wrote the example's files."""
    import re
    import shlex

    from p3o.cli import examples_main
    from p3o.config import load_config
    from p3o.rewards import get_verifier

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)  # the example runs where `p3o examples own-task` wrote its files
    assert examples_main(["own-task"]) == 0
    block = re.search(r"```bash\n(.*?)```", (root / "docs" / "tasks.md").read_text(), re.S).group(1)
    train_cmd = re.search(r"^p3o train (.*?)\n\n", block.replace("\\\n", " "), re.S | re.M).group(1)
    cfg = load_config(shlex.split(train_cmd))
    train = load_train_problems(cfg.task, seed=cfg.seed, n=cfg.task.n_train)
    held = load_eval_problems(cfg.task, seed=cfg.seed, n=cfg.task.n_eval, train=train)
    assert (len(train), len(held)) == (185, 15)  # the counts the docs state
    assert train[0].meta["answer_format"] == "####"  # solutions end in "#### n": the default template asks for it
    verifier = get_verifier(cfg.task.verifier)
    assert verifier("12 - 3 = 9\n#### 9", "9", timeout_s=10.0) == 1.0
    assert verifier("no number", "9", timeout_s=10.0) == 0.0
