"""Loaders for local data: presets (GSM8K, MATH/DeepScaleR, DAPO, AIME/AMC/MATH500), formats, bad-data errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from p3o.errors import ConfigError, DataError
from p3o.tasks import load_task


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_jsonl(tmp_path: Path) -> None:
    f = _jsonl(
        tmp_path / "test.jsonl",
        [
            {"question": "Ann has 3 pens and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            {"question": "Big sum?", "answer": "It is large.\n#### 1,234"},
        ],
    )
    ps = load_task("gsm8k", "all", path=str(f))  # a single file: "all" = every row ("test" = the held-out rows)
    assert [p.answer for p in ps] == ["7", "1234"]
    assert ps[0].solution.endswith("#### 7") and ps[0].meta["verifier"] == "gsm8k"
    assert ps[0].meta["answer_format"] == "####"
    # the preset:path shorthand and the $P3O_DATA layout give the same problems
    assert [p.answer for p in load_task(f"gsm8k:{f}", "all")] == ["7", "1234"]


def test_preset_default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("P3O_DATA", str(tmp_path))
    (tmp_path / "gsm8k").mkdir()
    _jsonl(tmp_path / "gsm8k" / "train.jsonl", [{"question": "q?", "answer": "#### 5"}])
    assert load_task("gsm8k", "train")[0].answer == "5"
    with pytest.raises(DataError, match="split 'test'"):
        load_task("gsm8k", "test")
    with pytest.raises(DataError, match="no local data"):
        load_task("math500", "test")


def test_math_parquet_and_boxed_fallback(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "problem": ["What is 1/2 + 1/4?", "Simplify x + x."],
            "solution": ["We get $\\boxed{\\frac{3}{4}}$.", "It is \\boxed{2x}."],
            "answer": ["\\frac{3}{4}", None],
            "level": ["Level 1", "Level 2"],
        }
    )
    f = tmp_path / "test.parquet"
    pq.write_table(table, f)
    for preset in ("math", "deepscaler", "math500"):
        ps = load_task(preset, "all", path=str(f))
        assert [p.answer for p in ps] == ["\\frac{3}{4}", "2x"]  # the missing answer comes from the last \boxed{}
        assert ps[0].meta["verifier"] == "math" and ps[0].meta["answer_format"] == "boxed"
        assert ps[1].solution == "It is \\boxed{2x}."


def test_dapo_layout(tmp_path: Path) -> None:
    wrapped = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind 2+2.\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    f = _jsonl(
        tmp_path / "dapo.jsonl",
        [
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": wrapped}],
                "ability": "MATH",
                "reward_model": {"ground_truth": "4", "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": "a1"},
            }
        ],
    )
    (p,) = load_task("dapo-math", "all", path=str(f))
    assert p.prompt == "Find 2+2." and p.answer == "4" and p.meta["raw_prompt"] == wrapped


def test_aime_amc_numeric_answers(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "aime.jsonl", [{"ID": "2024-I-1", "Problem": "Find n.", "Answer": 204, "Solution": "..."}])
    assert load_task("aime", "all", path=str(f))[0].answer == "204"
    g = _jsonl(tmp_path / "amc.jsonl", [{"problem": "Find m.", "answer": 142.0, "url": "x"}])
    assert load_task("amc", "all", path=str(g))[0].answer == "142"


def test_saved_hf_dataset_dirs(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="optional: the extra p3o[data] (TRL's extra brings it too)")

    ds = datasets.Dataset.from_dict({"question": ["a?", "b?"], "answer": ["#### 1", "#### 2"]})
    ds.save_to_disk(str(tmp_path / "flat"))
    assert [p.answer for p in load_task("gsm8k", "all", path=str(tmp_path / "flat"))] == ["1", "2"]
    dd = datasets.DatasetDict({"train": ds, "test": ds.select([1])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert [p.answer for p in load_task("gsm8k", "test", path=str(tmp_path / "dict"))] == ["2"]
    with pytest.raises(DataError, match="no split 'validation'"):
        load_task("gsm8k", "validation", path=str(tmp_path / "dict"))


def test_generic_path_field_mapping_shuffle(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "mine.jsonl", [{"q": f"Q{i}", "a": str(i)} for i in range(10)])
    ps = load_task(str(f), "all", fields={"prompt": "q", "answer": "a"})
    assert [p.answer for p in ps] == [str(i) for i in range(10)]
    a = load_task(str(f), "all", fields={"prompt": "q", "answer": "a"}, shuffle=True, seed=1, n=5)
    b = load_task(str(f), "all", fields={"prompt": "q", "answer": "a"}, shuffle=True, seed=1, n=5)
    assert [p.answer for p in a] == [p.answer for p in b] and len(a) == 5
    g = _jsonl(tmp_path / "auto.jsonl", [{"question": "x?", "answer": "work\n#### 9"}])
    (p,) = load_task(str(g), "all")  # auto-detected GSM8K style
    assert p.answer == "9" and p.meta["verifier"] == "gsm8k"


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([{"question": "ok?", "answer": "#### 1"}, {"question": "no answer"}], r"line 2: missing field 'answer'"),
        ([{"question": 5, "answer": "#### 1"}], r"line 1: field 'question' must be a string, got int"),
        ([{"question": "q", "answer": "#### "}], r"line 1: field 'answer' is empty"),
        ([{"question": "q", "answer": "no marker"}], r"line 1: field 'answer' has no '#### <answer>' marker"),
        ([{"question": "q", "answer": ["7"]}], r"line 1: field 'answer' must be a string or a number, got list"),
        ([{"question": "", "answer": "#### 1"}], r"line 1: field 'question' is empty"),
    ],
)
def test_bad_rows_name_file_row_field(tmp_path: Path, rows: list[dict], pattern: str) -> None:
    f = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=pattern) as info:
        load_task("gsm8k", "train", path=str(f))
    msg = str(info.value)
    assert str(f) in msg and "\n" not in msg


def test_bad_files(tmp_path: Path) -> None:
    f = tmp_path / "broken.jsonl"
    f.write_text('{"question": "a", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(DataError, match=r"broken.jsonl: line 2: invalid JSON"):
        load_task("gsm8k", path=str(f))
    with pytest.raises(DataError, match="no such file"):
        load_task("gsm8k", path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_task("gsm8k", path=str(tmp_path / "x.csv"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="cannot read parquet"):
        load_task("math", path=str(tmp_path / "bad.parquet"))
    with pytest.raises(ConfigError, match="neither a known task"):
        load_task("gsm9k")
    with pytest.raises(ConfigError, match="unknown option"):
        load_task("gsm8k", path=str(f), colour="red")
    with pytest.raises(ConfigError, match="unknown key"):
        load_task(str(f), fields={"query": "question"})


def test_a_task_owns_its_default_verifier(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from p3o.tasks import Problem, default_verifier, task_verifier

    # by name, when the problems do not say (hand-made Problems without meta)
    assert default_verifier("arithmetic") == "exact-int"
    assert default_verifier("gsm8k") == default_verifier("gsm8k:data/gsm8k.jsonl") == "gsm8k"
    assert default_verifier("math500") == default_verifier("data/mine.jsonl", [Problem("q", "1")]) == "math"
    # what the loaders stamp on each problem wins
    assert default_verifier("arithmetic", load_task("arithmetic", n=2)) == "exact-int"
    f = _jsonl(tmp_path / "mine.jsonl", [{"question": "Q?", "answer": "so\n#### 5"}])
    assert default_verifier(str(f), load_task(str(f), "all")) == "gsm8k"
    assert default_verifier("arithmetic", [Problem("q", "1", meta={"verifier": "format"})]) == "format"
    # task.verifier overrides the task's own
    assert task_verifier(SimpleNamespace(name="arithmetic", verifier=None)) == "exact-int"
    assert task_verifier(SimpleNamespace(name="arithmetic", verifier="math+format")) == "math+format"


def test_saved_dataset_without_the_data_extra_is_one_line_naming_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError, as when not installed
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_info.json").write_text("{}")
    with pytest.raises(
        DataError, match=r'saved `datasets` directory needs the datasets package: pip install "p3o\[data\]"'
    ):
        load_task("gsm8k", "all", path=str(tmp_path / "saved"))
    f = _jsonl(tmp_path / "mine.jsonl", [{"question": "a?", "answer": "#### 1"}])
    assert [p.answer for p in load_task("gsm8k", "all", path=str(f))] == ["1"]  # JSONL needs no extra
