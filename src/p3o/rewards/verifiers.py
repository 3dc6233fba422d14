"""Verifiers: `(completion, answer) -> float` in {0, 1}, bounded in time, never raising, never evaluating code.

| name        | extracts from the completion             | compares                                      |
|-------------|------------------------------------------|-----------------------------------------------|
| exact-int   | `#### n`, else the last `\\boxed{n}`      | integers, exactly                             |
| gsm8k       | `#### n` only (the GSM8K convention)     | numbers, exactly (1,234 = 1234; 7.0 = 7)       |
| math        | the final `\\boxed{}` (`final_boxed`), else `#### n` | as math-verify judges them                  |
| format      | —                                        | 1 if a final answer marker is present         |

The `math` verifier gives math-verify's verdict: its cheap paths (exact rationals, normalised strings) may only
accept, and everything they do not accept goes to math-verify (sympy) in a worker process with a hard time limit
and a memory cap. Only inputs that cost sympy unbounded time (huge exponents / factorials, sums, giant literals)
are kept from it. Where p3o deliberately scores otherwise than math-verify called on the whole completion:
`DIFFERENCES` (checked pair by pair against a committed corpus, tests/rewards/test_math_corpus.py). Timeouts and
worker restarts are counted (`p3o.rewards.tally`; `reward/timeouts` in the training metrics).

    verifier = get_verifier("math")
    score(["... \\boxed{\\frac12}"], ["0.5"], "math")   # -> [1.0]
"""

from __future__ import annotations

import copy
import inspect
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from p3o.errors import ConfigError, VerifierError
from p3o.rewards.custom import CustomVerifier
from p3o.rewards.extract import MAX_ANSWER_CHARS, final_boxed, hash_answer, last_boxed, parse_int, parse_number
from p3o.rewards.sandbox import Worker
from p3o.rewards.tally import Tally, record, tally

if TYPE_CHECKING:
    from torch import Tensor

    from p3o.types import Rollouts

Verifier = Callable[[str, str], float]


_WORKER: Worker | None = None
# What sympy can spend unbounded time or memory on, and no real answer needs: exponents with 4+ digits, nested
# powers and towers, Python's `**`, factorials of 4+ digit numbers, of a parenthesised power (`(10^{100})!`) or of a
# braced group, huge scientific notation, sums / products / limits / integrals, 41+ digit literals, `__`, macro
# definitions. Only cost decides what is here: anything else goes to math-verify, whose worker has a time and a
# memory limit.
_HOSTILE = re.compile(
    r"\^\s*\{?\s*[-+]?\d{4,}|\^\s*\{[^{}]*\^|\d\s*\^\s*\{?\s*\d+\s*\}?\s*\^|\*\*|\d[eE][-+]?\d{3,}"
    r"|\d{4,}\s*!|\([^()]*\^[^()]*\)\s*!|\}\s*!"
    r"|\\(?:fact|prod|sum|lim|int)(?![a-zA-Z])|\d{41,}|__|\\def|\\newcommand"
)
_EXPONENT = re.compile(r"\^\s*\{?\s*[-+]?(\d+)")
MAX_POWERS = 16  # more `^` than this in one answer: no real answer, sympy's expansion can take minutes


# Where p3o's `math` verifier deliberately scores a pair otherwise than math-verify called directly on the whole
# completion (`verify(parse("\\boxed{" + answer + "}"), parse(completion))`). Everywhere else they agree: the
# committed corpus tests/rewards/data/math_corpus.jsonl checks it pair by pair (docs/tasks.md, "Verifiers").
DIFFERENCES: dict[str, str] = {
    "no-marker": (
        "no \\boxed{}, \\fbox{} or '#### n' in the completion: p3o scores 0 (the policy must commit to a final "
        "answer); math-verify falls back to the last number or LaTeX anywhere in the text, so an unmarked chain "
        "of thought is rewarded when an intermediate number matches, and its plain-text path runs sympy's "
        "parse_expr, which evaluates the text as Python"
    ),
    "fbox": (
        "a final answer in \\fbox{} with no \\boxed{}: p3o reads the box; math-verify finds no answer "
        "(it reads \\fbox only beside a \\boxed)"
    ),
    "hash": (
        "'#### n' with no box: p3o reads the number after the last '####' (GSM8K's marker); math-verify does not "
        "know the marker and prefers an 'answer is X' phrase anywhere in the text ('So the answer is 17. #### 18' "
        "is 17 to math-verify, 18 to p3o)"
    ),
    "unreadable-box": (
        "a \\boxed{} answer math-verify's LaTeX grammar cannot read (`x~=~3`, `x = 2.`): p3o scores the box "
        "alone (0); math-verify falls back to a plain number anywhere in the completion ('Step 2: ... "
        "\\boxed{x~=~3}' matches the answer 2)"
    ),
}


def _worker() -> Worker:
    global _WORKER
    if _WORKER is None:
        _WORKER = Worker("p3o.rewards.mv_worker")
    return _WORKER


def _normalise(s: str) -> str:
    """Cheap LaTeX normalisation for string equality, only rewrites math-verify makes too (so what is equal here is
    equal to it): surrounding whitespace and `$`, `\\left` / `\\right`, `\\dfrac` / `\\tfrac` -> `\\frac`, runs of
    whitespace -> one space. (Removing spaces or unwrapping `\\text{}` would not be: math-verify reads `1 000` as
    1·000 and `\\text{5 hours}` as a symbol.)"""
    s = s.strip().strip("$").strip()
    for a, b in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")):
        s = s.replace(a, b)
    return re.sub(r"\s+", " ", s)


def safe_for_sympy(s: str) -> bool:
    """False for the few inputs that are kept from sympy because of their cost alone.

    Rejected: longer than MAX_ANSWER_CHARS; control characters other than tab and newline; 4+ digit or nested
    exponents, more than MAX_POWERS powers or 7+ exponent digits in all, `**`, factorials of 4+ digit numbers, of a
    parenthesised power (`(10^{100})!`) or of a braced group, huge scientific notation; sums / products / limits /
    integrals; 41+ digit literals; `__`; macro definitions; braces unbalanced or nested deeper than 10. Words,
    units, punctuation and unicode pass: math-verify reads them (`12 apples`, `3\\;\\text{m}`), and its worker's
    time and memory limits are the safety net.
    """
    if len(s) > MAX_ANSWER_CHARS or _HOSTILE.search(s):
        return False
    if any(ord(c) < 32 and c not in "\t\n" for c in s):
        return False
    exponents = _EXPONENT.findall(s)
    if s.count("^") > MAX_POWERS or sum(len(e) for e in exponents) > 6:
        return False
    depth = 0
    for c in s:
        depth += (c == "{") - (c == "}")
        if depth < 0 or depth > 10:
            return False
    return depth == 0


def exact_int(completion: str, answer: str) -> float:
    """1.0 iff the completion's final answer (`#### n`, else last `\\boxed{n}`) is the integer `answer`."""
    try:
        gold = parse_int(str(answer))
        if gold is None:
            return 0.0
        pred = hash_answer(completion)
        if pred is None:
            pred = last_boxed(completion)
        return float(pred is not None and parse_int(pred) == gold)
    except Exception:
        return 0.0


def gsm8k(completion: str, answer: str) -> float:
    """1.0 iff the number after the completion's last `####` equals `answer` (GSM8K; exact rational compare)."""
    try:
        gold = parse_number(str(answer).replace(",", ""))
        pred = hash_answer(completion)
        if gold is None or pred is None:
            return 0.0
        return float(parse_number(pred) == gold)
    except Exception:
        return 0.0


def _same_number(pred: str, gold: str) -> bool:
    """Equal exact rationals (`parse_number`) where math-verify agrees: neither side with a trailing period ("12."
    it cannot read) or `\\text{}` (`\\text{12}` = 12 but not 12.0 to it), and a percent sign on both or neither
    (50% = 50 but 12% != 12.0 to it); otherwise not settled here."""
    if any(s.rstrip().endswith(".") or "\\text" in s for s in (pred, gold)):
        return False
    if ("%" in pred) != ("%" in gold):
        return False
    a, b = parse_number(pred), parse_number(gold)
    return a is not None and a == b


def math_equal(pred: str, gold: str, timeout_s: float = 1.0) -> bool:
    """Are two final answers equal, as math-verify judges them (each read as the content of a `\\boxed{}`)?

    Fast paths may only accept: equal exact rationals (`_same_number`: "1,234" = "1234", "\\frac34" = "0.75",
    "50\\%" = "50%"), then equal normalised strings (`_normalise`). Everything they do not accept goes to
    math-verify in the worker process (`p3o.rewards.mv_worker`), killed after `timeout_s` (then False, counted as
    a timeout in the open `p3o.rewards.tally` tallies), unless `safe_for_sympy` keeps it away for its cost.
    """
    if _same_number(pred, gold) or _normalise(pred) == _normalise(gold):
        return True
    if not (safe_for_sympy(pred) and safe_for_sympy(gold)):
        return False
    value = _worker().call(
        {"op": "equal", "pred": pred, "gold": gold, "seconds": max(1, int(timeout_s))}, timeout_s=timeout_s
    )
    return bool(value)


def math_reward(completion: str, answer: str, timeout_s: float = 1.0) -> float:
    """1.0 iff the completion's final answer is mathematically equal to `answer`, as math-verify judges it.

    The final answer is the last `\\boxed{}` / `\\fbox{}` with the boxes math-verify joins to it (`final_boxed`:
    `\\boxed{3} and \\boxed{5}` is the set {3, 5}), else the number after `#### ` (GSM8K); no marker, no reward
    (see DIFFERENCES). The call returns within `timeout_s` once the worker is up (its one-time start-up, ~1–3 s, is
    not counted).
    """
    t0 = time.perf_counter()
    try:
        if not isinstance(completion, str):
            return 0.0
        pred = final_boxed(completion)
        if pred is None:
            pred = hash_answer(completion)
        gold = str(answer).strip()
        if gold.startswith("\\boxed") or "\\boxed{" in gold:
            gold = last_boxed(gold) or gold
        if pred is None or not gold:
            return 0.0
        left = timeout_s - (time.perf_counter() - t0) - 0.05  # the whole call, extraction included, fits the limit
        return float(math_equal(pred, gold, timeout_s=max(0.05, left)))
    except Exception:
        return 0.0


def format_reward(completion: str, answer: str = "") -> float:
    """1.0 iff the completion states a final answer (`#### <number>` or a non-empty `\\boxed{}`); `answer` unused."""
    try:
        return float(hash_answer(completion) is not None or last_boxed(completion) is not None)
    except Exception:
        return 0.0


VERIFIERS: dict[str, Verifier] = {
    "exact-int": exact_int,
    "gsm8k": gsm8k,
    "math": math_reward,
    "format": format_reward,
}


def get_verifier(name: str) -> Verifier:
    """The verifier called `name`; "<name>+format" adds 0.1 × the format reward.

    `name` is a built-in (exact-int, gsm8k, math, format) or a user function `package.module:function` /
    `path/to/file.py:function` (`p3o.rewards.custom.CustomVerifier`: a worker process, time-limited per call).
    Unknown or unusable names raise VerifierError (a ValueError and a ConfigError).
    """
    base, plus, extra = name.partition("+")
    if plus and extra != "format":
        raise VerifierError(f"unknown verifier {name!r}; only '+format' may follow a verifier name")
    if ":" in base:
        fn: Verifier = CustomVerifier(base)
    elif base in VERIFIERS:
        fn = VERIFIERS[base]
    else:
        raise VerifierError(
            f"unknown verifier {name!r}; known: {', '.join(VERIFIERS)} (optionally '<name>+format'), "
            "or your own 'package.module:function'"
        )
    if not plus:
        return fn

    def with_format(completion: str, answer: str, timeout_s: float = 1.0) -> float:
        main = fn(completion, answer, timeout_s=timeout_s) if _takes_timeout(fn) else fn(completion, answer)
        return main + 0.1 * format_reward(completion)

    with_format.__name__ = f"{fn.__name__}_with_format"
    return with_format


def _takes_timeout(fn: Callable[..., float]) -> bool:
    try:
        return "timeout_s" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def score(
    completions: Sequence[str], answers: Sequence[str], verifier: str | Verifier = "exact-int", timeout_s: float = 1.0
) -> list[float]:
    """Rewards for a batch: `verifier(completions[i], answers[i])` for each i, each call time-limited.

    Built-in verifiers are bounded by construction (short scans) and `math` gives sympy at most `timeout_s` in a
    worker process; so does a `module:function` name (`CustomVerifier`). A callable passed directly runs
    in-process, without a time limit; an exception from it scores 0.0. Each pair is counted as a verification in
    the open `p3o.rewards.tally` tallies (timeouts and worker restarts are counted where they happen).
    """
    assert len(completions) == len(answers), (len(completions), len(answers))
    fn = get_verifier(verifier) if isinstance(verifier, str) else verifier
    takes_timeout = _takes_timeout(fn)
    out = []
    for c, a in zip(completions, answers):
        try:
            r = fn(c, a, timeout_s=timeout_s) if takes_timeout else fn(c, a)
            out.append(float(r))
        except Exception:
            out.append(0.0)
    record("verifications", len(out))
    return out


TIMEOUT_WARN_RATE = 0.01  # warn once per run when more than this share of verifications timed out


class RewardFn:
    """``reward_fn(rollouts) -> (N,) float32``: r_i = verifier(rollouts.texts[i], rollouts.answers[i]), counted.

    Attributes:
        verifier: the resolved verifier; timeout_s: the per-call limit.
        tally: this function's lifetime `Tally` (verifications, timeouts, restarts, errors), every thread's calls.
        warned: whether the timeout warning was printed (once, when timeouts exceed TIMEOUT_WARN_RATE of the
            verifications so far).
    """

    def __init__(self, verifier: Verifier, timeout_s: float, name: str) -> None:
        self.verifier, self.timeout_s, self.name = verifier, timeout_s, name
        self.tally = Tally()
        self.warned = False
        self._lock = threading.Lock()

    def __call__(self, r: Rollouts) -> Tensor:
        import torch  # heavy: torch start-up; the reward workers import p3o.rewards, and need no torch

        with tally() as t:
            rewards = score(r.texts, r.answers, self.verifier, timeout_s=self.timeout_s)
        with self._lock:
            self.tally.add(t)
            total = copy.copy(self.tally)
            warn = not self.warned and total.timeouts > TIMEOUT_WARN_RATE * total.verifications
            self.warned = self.warned or warn
        if warn:
            print(
                f"p3o: warning: verifier {self.name!r}: {total.timeouts} of {total.verifications} verifications "
                f"({100 * total.timeout_rate:.1f}%) ran over the {self.timeout_s:g}s limit and scored 0 "
                f"(task.reward_timeout_s; reward/timeouts in metrics.jsonl; reported once)",
                file=sys.stderr,
                flush=True,
            )
        return torch.tensor(rewards, dtype=torch.float32)


def make_reward_fn(verifier: str | Verifier, *, timeout_s: float = 1.0, option: str = "task.verifier") -> RewardFn:
    """The reward of a batch of rollouts: ``reward_fn(r) -> (N,) float32``, r_i = verifier(r.texts[i], r.answers[i]).

    Each call is time-limited as in :func:`score` (``timeout_s``) and counted (`RewardFn.tally`); more than 1 %
    timeouts is reported once on stderr. A verifier name is resolved once, here, so an unknown name or an unusable
    ``module:function`` fails at once: ConfigError ``"<option>: ..."``.
    """
    try:
        fn = get_verifier(verifier) if isinstance(verifier, str) else verifier
    except ConfigError as err:
        raise ConfigError(f"{option}: {err}") from None
    name = verifier if isinstance(verifier, str) else getattr(verifier, "__name__", "verifier")
    return RewardFn(fn, timeout_s, name)
