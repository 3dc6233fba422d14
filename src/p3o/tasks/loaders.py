"""Loaders for real math data stored locally (JSONL, JSON, parquet, `datasets.save_to_disk` dirs), with field presets.

Offline by design: nothing is downloaded. A preset names which fields hold the question, the reference answer and
the worked solution, and which verifier fits:

    load_task("gsm8k", "test", path="data/gsm8k/")                # a folder with train.jsonl / test.jsonl
    load_task("math500:data/math500.parquet", "all")             # preset:path shorthand; "all": every row
    load_task("data/mine.jsonl", "train", fields={"prompt": "q", "answer": "a"})  # rows not held out
    load_task("data/mine.jsonl", "test", test_fraction=0.1)       # the held-out rows (hash of the question)
    load_task("arithmetic", "train", seed=0, n=512, difficulty=2)  # the built-in task

A single source (one file, or a saved Dataset without splits) is split by a hash of each question
(`in_test_split`): "train" and "test" never share a question, whatever the row order or seed.

Without `path`, a preset looks under `$P3O_DATA/<preset>/` (default `<cache>/data/<preset>/`) for
`<split>.jsonl`, `<split>.json`, `<split>.parquet`, `<split>-*.parquet` or a saved dataset dir `<split>/`.
Bad rows raise DataError naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError, DataError, json_object
from p3o.rewards.extract import last_boxed
from p3o.tasks import arithmetic
from p3o.tasks.arithmetic import load_arithmetic
from p3o.tasks.base import Problem
from p3o.tasks.scratchpad import PAD_LEVELS, load_scratchpad


@dataclass(frozen=True)
class Preset:
    """Where a data set keeps its fields (first candidate present wins; dotted names reach into structs).

    Attributes:
        prompt: candidate fields for the question (a string, or a chat `[{"role", "content"}]` list).
        answer: candidate fields for the reference answer.
        solution: candidate fields for the worked solution (optional).
        verifier: the `p3o.rewards` verifier name that fits this data.
        answer_format: "####" or "boxed" — what the default prompt template asks for.
        hash_answer: the answer field is a GSM8K solution ending in `#### <n>`; split it into solution + answer.
    """

    prompt: tuple[str, ...] = ("prompt", "problem", "question", "Problem", "Question")
    answer: tuple[str, ...] = ("answer", "Answer", "ground_truth", "reward_model.ground_truth", "final_answer")
    solution: tuple[str, ...] = ("solution", "Solution")
    verifier: str = "math"
    answer_format: str = "boxed"
    hash_answer: bool = False


_MATH = Preset(prompt=("problem", "Problem"), answer=("answer", "Answer"))
PRESETS: dict[str, Preset] = {
    "gsm8k": Preset(
        prompt=("question",), answer=("answer",), solution=(), verifier="gsm8k", answer_format="####", hash_answer=True
    ),
    "math": _MATH,
    "deepscaler": _MATH,
    "math500": _MATH,
    "aime": Preset(prompt=("problem", "Problem", "question"), answer=("answer", "Answer")),
    "amc": Preset(prompt=("problem", "Problem", "question"), answer=("answer", "Answer")),
    "dapo-math": Preset(
        prompt=("prompt", "problem"), answer=("reward_model.ground_truth", "answer", "solution"), solution=()
    ),
}
_AUTO = Preset()

# DAPO-Math-17k wraps each problem in an instruction asking for "Answer: $Answer"; we keep the bare problem so the
# prompt template decides the answer format (the original text stays in meta["raw_prompt"]).
_DAPO_WRAPPER = re.compile(
    r"^\s*Solve the following math problem step by step\..*?\n\n(?P<q>.*?)\n\nRemember to put your answer on its own "
    r"line after \"Answer:\"\.?\s*$",
    re.S,
)
_SUFFIXES = ("jsonl", "json", "parquet")
DEFAULT_TEST_FRACTION = 0.1  # held-out share of a single data file (task.test_fraction)
SINGLE_SPLITS = ("train", "test", "all")


def data_root() -> Path:
    """`$P3O_DATA`, else `<$P3O_CACHE or ~/.cache/p3o>/data`."""
    if os.environ.get("P3O_DATA"):
        return Path(os.environ["P3O_DATA"]).expanduser()
    return Path(os.environ.get("P3O_CACHE") or Path.home() / ".cache" / "p3o").expanduser() / "data"


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))


def read_rows(path: str | Path, split: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, row)` for every record of a JSONL / JSON / parquet file or a saved `datasets` dir.

    `where` names the record for error messages ("line 4" in JSONL, "row 3" otherwise, 0-based rows).
    Raises DataError on a missing file, an unreadable file, or a record that is not a JSON object.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if _is_saved_dataset(path):
        try:
            import datasets  # optional: datasets (extra `p3o[data]`), heavy; only a saved `datasets` dir needs it
        except ImportError:
            raise DataError(
                f'{path}: a saved `datasets` directory needs the datasets package: pip install "p3o[data]" '
                "(or save the rows as .jsonl)"
            ) from None
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as err:
            raise DataError(f"{path}: cannot load saved dataset ({type(err).__name__}: {err})") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{path}: no split {split!r} in saved dataset; available: {', '.join(ds)}")
            ds = ds[split]
        for i, row in enumerate(ds):
            yield f"row {i}", row
        return
    if path.is_dir():
        raise DataError(f"{path}: a directory that is not a saved dataset (expected a .jsonl / .json / .parquet file)")
    suffix = path.suffix.lower().lstrip(".")
    if suffix == "parquet":
        try:
            import pyarrow.parquet as pq  # optional: pyarrow (extra `p3o[data]`, through datasets)

            table = pq.read_table(path)
        except ImportError:
            raise DataError(f'{path}: reading parquet needs pyarrow: pip install "p3o[data]" (or pyarrow)') from None
        except Exception as err:
            raise DataError(f"{path}: cannot read parquet ({type(err).__name__}: {err})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"row {i}", row
        return
    if suffix not in ("jsonl", "json"):
        raise DataError(f"{path}: unsupported file type '.{suffix}'; expected .jsonl, .json or .parquet")
    with open(path, encoding="utf-8") as fh:
        if suffix == "json":
            try:
                data = json.load(fh)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise DataError(f"{path}: expected a JSON list of objects (or JSON Lines)")
            for i, row in enumerate(data):
                if not isinstance(row, dict):
                    raise DataError(f"{path}: row {i}: expected a JSON object, got {type(row).__name__}")
                yield f"row {i}", row
            return
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            yield f"line {lineno}", json_object(line, f"{path}: line {lineno}")


def _get(row: dict[str, Any], name: str) -> tuple[bool, Any]:
    """`row[name]`, following dots into nested dicts; (found, value)."""
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in names:
        found, value = _get(row, name)
        if found and value is not None:
            return name, value
    return None, None


def _as_text(value: Any, where: str, field: str, *, allow_number: bool = False) -> str:
    if isinstance(value, bool):
        raise DataError(f"{where}: field '{field}' must be a string, got bool")
    if isinstance(value, str):
        return value
    if allow_number and isinstance(value, int):
        return str(value)
    if allow_number and isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    kind = "a string or a number" if allow_number else "a string"
    raise DataError(f"{where}: field '{field}' must be {kind}, got {type(value).__name__}")


def _prompt_text(value: Any, where: str, field: str) -> str:
    """A string, or the last user turn of a chat-message list (DAPO / verl layout)."""
    if isinstance(value, list):
        users = [
            m for m in value if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
        ]
        if not users:
            raise DataError(f"{where}: field '{field}' is a message list without a user turn with string content")
        return users[-1]["content"]
    return _as_text(value, where, field)


def _hash_answer(text: str) -> tuple[str, str] | None:
    """Split a GSM8K answer "...reasoning...\\n#### 1,234" into (solution, "1234")."""
    if "####" not in text:
        return None
    _, _, tail = text.rpartition("####")
    answer = tail.strip().replace(",", "").rstrip(".")
    return text, answer if answer else ""


def problems_from_rows(
    rows: Iterator[tuple[str, dict[str, Any]]],
    source: str,
    preset: Preset,
    fields: dict[str, str] | None = None,
) -> list[Problem]:
    """Map raw rows to `Problem`s with `preset` (explicit `fields` {"prompt"|"answer"|"solution": name} win).

    Raises DataError "<source>: <row>: ..." for a missing field, a wrong type or an empty answer.
    """
    fields = dict(fields or {})
    unknown = set(fields) - {"prompt", "answer", "solution"}
    if unknown:
        raise ConfigError(f"task fields: unknown key(s) {sorted(unknown)}; known: prompt, answer, solution")
    cands = {k: (fields[k],) if k in fields else getattr(preset, k) for k in ("prompt", "answer", "solution")}
    out: list[Problem] = []
    for where_row, row in rows:
        where = f"{source}: {where_row}"
        p_name, p_val = _pick(row, cands["prompt"])
        if p_name is None:
            raise DataError(
                f"{where}: missing field '{cands['prompt'][0]}' (looked for: {', '.join(cands['prompt'])}; "
                f"task.question_key names it)"
            )
        prompt = _prompt_text(p_val, where, p_name)
        meta: dict[str, Any] = {
            "verifier": preset.verifier,
            "answer_format": preset.answer_format,
            "source": source,
            "index": where_row,
        }
        m = _DAPO_WRAPPER.match(prompt)
        if m:
            meta["raw_prompt"], prompt = prompt, m.group("q").strip()
        if not prompt.strip():
            raise DataError(f"{where}: field '{p_name}' is empty")
        s_name, s_val = _pick(row, cands["solution"]) if cands["solution"] else (None, None)
        solution = _as_text(s_val, where, s_name) if s_name is not None else ""
        a_name, a_val = _pick(row, cands["answer"])
        if a_name is None:
            if solution and last_boxed(solution):
                a_name, a_val = s_name, last_boxed(solution)
            else:
                raise DataError(
                    f"{where}: missing field '{cands['answer'][0]}' (looked for: {', '.join(cands['answer'])}; "
                    f"task.answer_key names it)"
                )
        answer = _as_text(a_val, where, a_name, allow_number=True).strip()
        if preset.hash_answer or (preset is _AUTO and "####" in answer):
            split = _hash_answer(answer)
            if split is None:
                raise DataError(f"{where}: field '{a_name}' has no '#### <answer>' marker")
            solution, answer = split
            meta["verifier"], meta["answer_format"] = "gsm8k", "####"
        elif a_name == s_name:  # answer recovered from the solution's last \boxed{}
            pass
        elif preset is _AUTO and "####" in solution and "\\boxed" not in solution:
            meta["answer_format"] = "####"  # own data whose worked solutions end in `#### n`: ask for that format
        elif "\\boxed" in answer:
            answer = last_boxed(answer) or answer
        if not answer:
            raise DataError(f"{where}: field '{a_name}' is empty")
        out.append(Problem(prompt=prompt, answer=answer, solution=solution, meta=meta))
    return out


def _find_split_file(root: Path, split: str) -> Path | None:
    if _is_saved_dataset(root / split):
        return root / split
    if _is_saved_dataset(root):
        return root
    for suffix in _SUFFIXES:
        if (root / f"{split}.{suffix}").is_file():
            return root / f"{split}.{suffix}"
    shards = sorted(root.glob(f"{split}-*.parquet"))
    return shards[0] if len(shards) == 1 else (root if shards else None)


def _rows_for(path: Path, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if path.is_dir() and not _is_saved_dataset(path):
        shards = sorted(path.glob(f"{split}-*.parquet"))
        if not shards:
            found = _find_split_file(path, split)
            if found is None:
                raise DataError(
                    f"{path}: no data for split {split!r} (looked for {split}.jsonl/.json/.parquet, "
                    f"{split}-*.parquet, a saved dataset)"
                )
            yield from read_rows(found, split)
            return
        for shard in shards:
            for where, row in read_rows(shard, split):
                yield f"{shard.name} {where}", row
        return
    yield from read_rows(path, split)


def holdout_key(question: str) -> str:
    """The split key of a question: lower-cased, whitespace collapsed (so trivially re-typed copies share a split)."""
    return " ".join(question.lower().split())


def in_test_split(question: str, test_fraction: float = DEFAULT_TEST_FRACTION) -> bool:
    """Is `question` held out? True iff u < test_fraction, u = sha256("p3o-holdout|" + holdout_key(question)) / 2^256.

    A pure function of the question text: the same question is in the same split in every run, on every machine,
    whatever the row order, seed or file name; identical questions can never land on both sides.
    """
    digest = hashlib.sha256(("p3o-holdout|" + holdout_key(question)).encode()).digest()
    return int.from_bytes(digest[:8], "big") < test_fraction * 2.0**64


def is_single_source(path: str | Path) -> bool:
    """True for data without splits of its own: one file, or a saved `datasets.Dataset` (not a DatasetDict)."""
    path = Path(path)
    if path.is_file():
        return True
    return _is_saved_dataset(path) and not (path / "dataset_dict.json").exists()


def resolve_source(name: str, path: str | Path | None = None) -> tuple[Preset, Path]:
    """(preset, data path) of a task name that is not "arithmetic" (preset, "preset:path" or a path).

    Raises DataError / ConfigError when the path does not exist or the name is unknown.
    """
    preset_name, _, rest = name.partition(":")
    if preset_name in PRESETS:
        explicit = path or rest
        where = Path(explicit).expanduser() if explicit else data_root() / preset_name
        if explicit and not where.exists():
            raise DataError(f"{where}: no such file or directory")
        if not where.exists():
            raise DataError(
                f"{preset_name}: no local data at {where} (offline: save the data set there, or pass path=... "
                f"to a .jsonl/.parquet file or a datasets.save_to_disk dir)"
            )
        return PRESETS[preset_name], where
    where = Path(path or name).expanduser()
    if not where.exists():
        known = ", ".join(["arithmetic", *PRESETS])
        raise ConfigError(f"task.name: {name!r} is neither a known task ({known}) nor an existing path")
    return _AUTO, where


def default_verifier(task_name: str, problems: Sequence[Problem] = ()) -> str:
    """The verifier a task is scored with when none is named (`task.verifier` unset): the task's own.

    1. the first problem's ``meta["verifier"]`` — every loader stamps it: the built-in task ``"exact-int"``, a
       preset its ``Preset.verifier``, a data file ``"gsm8k"`` when its answers carry ``#### n``, else ``"math"``;
    2. else by the task's name: ``"arithmetic"`` → ``arithmetic.VERIFIER`` (``"exact-int"``), a preset (also
       ``"preset:path"``) → its ``Preset.verifier``, anything else (a data path) → ``"math"`` (numbers exactly,
       LaTeX by math-verify).

    The training loop, ``p3o eval`` and the warm start's pass@1 all resolve the verifier here; a name given with
    ``task.verifier`` / ``--verifier`` (e.g. your own ``package.module:function``) overrides it.
    """
    meta = getattr(problems[0], "meta", None) if problems else None
    if isinstance(meta, dict) and meta.get("verifier"):
        return str(meta["verifier"])
    if task_name == "arithmetic":
        return arithmetic.VERIFIER
    preset = PRESETS.get(task_name.partition(":")[0])
    return preset.verifier if preset is not None else _AUTO.verifier


def load_task(name: str, split: str = "train", *, seed: int = 0, n: int | None = None, **kwargs: Any) -> list[Problem]:
    """Problems of a task.

    Args:
        name: "arithmetic" (built-in; kwargs `difficulty`, `kind`, `steps`, `digits`, `ops`; difficulty "pad" /
            "pad-hard" is the scratchpad testbed, `p3o.tasks.scratchpad`, which takes no other kwargs), a preset
            (gsm8k, math, deepscaler, dapo-math, aime, amc, math500), "preset:path", or a path to a data file/dir.
        split: a folder or DatasetDict: the split file / split to read ("train", "test", ...). A single source
            (one file, or a saved Dataset without splits): "train" = the rows not held out, "test" = the held-out
            rows (`in_test_split` of the question, fraction `test_fraction`), "all" = every row.
        seed: the arithmetic generator's seed; for files, the shuffle seed when `shuffle=True`.
        n: keep the first `n` problems (after the split and the optional shuffle); None = all (arithmetic: 1000).
        kwargs (files): `path` (file or dir; overrides the preset's default location), `fields`
            ({"prompt"|"answer"|"solution": column}), `shuffle` (bool), `test_fraction` (held-out share of a
            single source, default 0.1; 0 puts every row in "train").
    """
    if name == "arithmetic" and kwargs.get("difficulty") in PAD_LEVELS:  # the scratchpad testbed (tasks.scratchpad)
        extra = sorted(set(kwargs) - {"difficulty"})
        if extra:
            raise ConfigError(f"task.difficulty {kwargs['difficulty']!r}: unknown option(s) {extra}; known: none")
        return load_scratchpad(split, seed=seed, n=1000 if n is None else int(n), difficulty=kwargs["difficulty"])
    if name == "arithmetic":
        return load_arithmetic(split, seed=seed, n=n, **kwargs)
    path_arg = kwargs.pop("path", None)
    fields = kwargs.pop("fields", None)
    shuffle = bool(kwargs.pop("shuffle", False))
    test_fraction = float(kwargs.pop("test_fraction", DEFAULT_TEST_FRACTION))
    if kwargs:
        raise ConfigError(
            f"task {name!r}: unknown option(s) {sorted(kwargs)}; known: path, fields, shuffle, test_fraction"
        )
    if not 0.0 <= test_fraction < 1.0:
        raise ConfigError(f"task.test_fraction: must be in [0, 1), got {test_fraction}")
    preset, path = resolve_source(name, path_arg)
    if is_single_source(path):
        if split not in SINGLE_SPLITS:
            raise ConfigError(
                f"{path}: a single data source has the splits {', '.join(SINGLE_SPLITS)} (held out by a hash of "
                f"the question), not {split!r}; use a folder with {split}.jsonl for named splits"
            )
        problems = problems_from_rows(_rows_for(path, split), str(path), preset, fields)
        if split != "all":
            want_test = split == "test"
            problems = [p for p in problems if in_test_split(p.prompt, test_fraction) == want_test]
    else:
        problems = problems_from_rows(_rows_for(path, split), str(path), preset, fields)
    if shuffle:
        random.Random(seed).shuffle(problems)
    return problems if n is None else problems[: int(n)]
