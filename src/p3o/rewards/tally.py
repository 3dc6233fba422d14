"""Counts of what the verifiers did: verifications, timeouts, worker restarts, errors — per batch and per run.

A `Tally` is opened around the code that scores completions; every counting event in the same thread (a pair
verified by `score`, a worker call that overran its limit, a worker killed and replaced) is added to every tally
open in that thread, so nested tallies (the run's, the batch's) both see it and another thread's scoring (the
in-loop evaluation beside an async generator) does not leak into them.

    with tally() as t:
        rewards = reward_fn(rollouts)
    t.metrics()   # {"reward/timeouts": 0.0, "reward/restarts": 0.0, "reward/errors": 0.0}
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

_LOCAL = threading.local()


@dataclass(eq=False)  # identity: two tallies with equal counts are still two tallies
class Tally:
    """Counters of verifier events (all ints, ≥ 0).

    Attributes:
        verifications: (completion, answer) pairs scored through `p3o.rewards.score` / a `make_reward_fn` function.
        timeouts: worker calls that overran their time limit (the pair scores 0; the worker is killed).
        restarts: worker processes killed and replaced (after a timeout, or because the worker died).
        errors: worker calls that failed (the pair scores 0; the worker keeps serving).
    """

    verifications: int = 0
    timeouts: int = 0
    restarts: int = 0
    errors: int = 0

    def add(self, other: Tally) -> None:
        """Add `other`'s counts to this tally's."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def timeout_rate(self) -> float:
        """timeouts / verifications (0.0 before any verification)."""
        return self.timeouts / self.verifications if self.verifications else 0.0

    def metrics(self) -> dict[str, float]:
        """The metrics row's keys: ``reward/timeouts``, ``reward/restarts``, ``reward/errors`` (floats)."""
        return {
            "reward/timeouts": float(self.timeouts),
            "reward/restarts": float(self.restarts),
            "reward/errors": float(self.errors),
        }


def _stack() -> list[Tally]:
    stack: list[Tally] | None = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def record(kind: str, n: int = 1) -> None:
    """Add `n` to counter `kind` ("verifications", "timeouts", "restarts", "errors") of every tally open in this
    thread (none open: nothing happens)."""
    for t in _stack():
        setattr(t, kind, getattr(t, kind) + n)


@contextmanager
def tally() -> Iterator[Tally]:
    """Count the verifier events of this thread while the block runs; yields the (live) `Tally`."""
    t = Tally()
    stack = _stack()
    stack.append(t)
    try:
        yield t
    finally:
        stack.remove(t)
