"""Names a package exports but imports on first use (PEP 562), so that its light commands never load torch.

__getattr__ = lazy_exports(__name__, {"p3o.eval.passk": ("pass_at_k",), "p3o.eval.runner": ("evaluate",)})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for `package`: each name of ``modules[m]`` is imported from module `m` when it
    is first read; any other name raises the AttributeError Python raises for a missing module attribute."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
