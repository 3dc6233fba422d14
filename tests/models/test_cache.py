"""The model cache: one atomic build (models, tokenizers), and a leaf module that breaks the models/ import circle."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from p3o.models.cache import atomic_build, is_complete

MODELS = Path(__file__).resolve().parents[2] / "src" / "p3o" / "models"


def _imports(module: str) -> set[str]:
    """The sibling `p3o.models.*` modules a module imports, at the top or inside a function."""
    tree = ast.parse((MODELS / f"{module}.py").read_text())
    return {
        node.module.split(".")[2]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("p3o.models.")
    }


def test_no_import_circle_in_models() -> None:
    graph = {p.stem: _imports(p.stem) for p in MODELS.glob("*.py") if p.stem != "__init__"}
    assert graph["cache"] == set()  # the leaf every cache entry is built through
    # hub loads; smollm2 builds and tiny keys the warm-started base (built by p3o.train.sft): neither imports hub
    assert "hub" not in graph["tiny"] | graph["smollm2"]
    assert graph["tiny"] == {"cache"} and graph["checkpoints"] == set()

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d})) for d in graph.get(start, ()))

    assert not [m for m in graph if reaches(m, m)]


def test_atomic_build_once_with_its_own_completeness_test(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "tokenizer.json").write_text("{}")

    def done(p: Path) -> bool:
        return (p / "tokenizer.json").is_file()

    target = tmp_path / "tokenizers" / "t"
    threads = [threading.Thread(target=atomic_build, args=(target, build), kwargs={"done": done}) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and done(target) and not is_complete(target)  # a tokenizer is not a model
    assert not [p for p in target.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    atomic_build(target, build, done=done)
    assert len(calls) == 1  # reused
    atomic_build(target, build, force=True, done=done)
    assert len(calls) == 2 and done(target)  # rebuilt and swapped in whole

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_build(tmp_path / "models" / "m", broken)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".m.lock"]  # nothing half-written left behind
