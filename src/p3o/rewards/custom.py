"""Your own reward: `--task.verifier package.module:function` (or `path/to/file.py:function`), time-limited.

The function is called once per completion as

    def my_reward(completion: str, answer: str) -> float:   # in [0, 1]; 1.0 = correct
        ...

with the decoded response text (no prompt) and the problem's reference answer string, exactly like the built-in
verifiers. It runs in a worker process (`p3o.rewards.custom_worker`) with the same hard per-call limit as the
built-in `math` verifier (`task.reward_timeout_s`): a call that overruns is killed and scores 0; a call that
raises, or returns something that is not a finite number, scores 0. Each kind of failure is reported once on
stderr and counted (`errors`, `timeouts`). The module is imported once here as well, so a typo fails at start-up
with one line naming the option.

    verifier = CustomVerifier("my_rewards:exact")   # my_rewards.py in the working directory or on sys.path
    verifier("... #### 7", "7", timeout_s=1.0)      # -> 1.0
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p3o.errors import VerifierError
from p3o.rewards.sandbox import Worker

_SPEC = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")


def parse_spec(spec: str) -> tuple[str, str]:
    """`"pkg.mod:fn"` -> ("pkg.mod", "fn"); `"dir/file.py:fn"` -> ("dir/file.py", "fn"). VerifierError otherwise."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise VerifierError(f"verifier {spec!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    return m.group("module"), m.group("function")


def _import(module: str, spec: str) -> Any:
    if module.endswith(".py"):
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise VerifierError(f"verifier {spec!r}: no such file {path}")
        name = f"p3o_user_verifier_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        assert loader_spec is not None and loader_spec.loader is not None
        mod = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = mod
        try:
            loader_spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        # the `p3o` console script does not put the working directory on sys.path; `python -m` does
        top = module.split(".")[0]
        if err.name != top or os.getcwd() in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(module)


def load_function(spec: str) -> Callable[[str, str], Any]:
    """Import the function named by `spec`; VerifierError (one line) when it cannot be imported or called so."""
    module, function = parse_spec(spec)
    try:
        mod = _import(module, spec)
    except VerifierError:
        raise
    except BaseException as err:
        raise VerifierError(f"verifier {spec!r}: cannot import {module} ({type(err).__name__}: {err})") from None
    fn = getattr(mod, function, None)
    if fn is None:
        raise VerifierError(f"verifier {spec!r}: {module} has no attribute {function!r}")
    if not callable(fn):
        raise VerifierError(f"verifier {spec!r}: {module}.{function} is not callable")
    try:
        inspect.signature(fn).bind("completion", "answer")
    except TypeError:
        raise VerifierError(
            f"verifier {spec!r}: {function} must accept (completion: str, answer: str), "
            f"its signature is {inspect.signature(fn)}"
        ) from None
    except ValueError:  # no signature (some builtins): let the first call tell
        pass
    return fn


class CustomVerifier:
    """`fn(completion, answer) -> float` from a `module:function` spec, each call in a worker with a time limit.

    Attributes:
        spec: the spec as given (`.py` paths are resolved to absolute paths for the worker).
        calls, errors, timeouts: counters over the verifier's lifetime.
    """

    def __init__(self, spec: str, start_timeout_s: float = 60.0) -> None:
        module, function = parse_spec(spec)
        load_function(spec)  # fail fast, in this process, with a one-line error
        if module.endswith(".py"):
            spec = f"{Path(module).expanduser().resolve()}:{function}"
        self.spec = spec
        self.__name__ = spec
        self.start_timeout_s = start_timeout_s
        self.calls = self.errors = self.timeouts = 0
        self._warned: set[str] = set()
        self._worker: Worker | None = None

    def _get_worker(self) -> Worker:
        if self._worker is None:
            paths = [p if p else os.getcwd() for p in sys.path]
            args = (self.spec, json.dumps(paths))
            self._worker = Worker("p3o.rewards.custom_worker", start_timeout_s=self.start_timeout_s, args=args)
        return self._worker

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            print(f"p3o: warning: verifier {self.spec!r} {message} (reported once)", file=sys.stderr, flush=True)

    def __call__(self, completion: str, answer: str, timeout_s: float = 1.0) -> float:
        """The function's score of `completion` against `answer`, or 0.0 when it raises or overruns `timeout_s`."""
        self.calls += 1
        try:
            status, value = self._get_worker().request(
                {"completion": str(completion), "answer": str(answer)}, timeout_s=timeout_s
            )
        except Exception as err:  # the worker did not start
            status, value = "error", f"{type(err).__name__}: {err}"
        if status == "ok":
            return float(value)
        if status == "timeout":
            self.timeouts += 1
            self._warn_once(
                "timeout",
                f"did not return within {timeout_s:g}s (task.reward_timeout_s): killed, the completion scores 0",
            )
        else:
            self.errors += 1
            self._warn_once("error", f"failed ({value}): the completion scores 0")
        return 0.0

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
