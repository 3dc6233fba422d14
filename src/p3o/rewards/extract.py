"""Bounded-time answer extraction: the last `\\boxed{...}`, the `#### n` marker, plain numbers.

Every function here does O(len(text)) work at most (one `rfind`, then a scan of a short window), never uses a
backtracking-prone regex on the whole completion, and never evaluates anything.

    last_boxed("so \\boxed{\\frac{1}{2}}.")   # -> "\\frac{1}{2}"
    hash_answer("3 + 4 = 7\\n#### 7")          # -> "7"
    parse_number("1,234")                      # -> Fraction(1234, 1)
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 512  # an extracted answer longer than this is treated as no answer
MAX_BRACE_DEPTH = 32
MAX_NUMBER_CHARS = 64

_HASH_NUMBER = re.compile(r"[ \t]*\$?[ \t]*([-+]?[0-9][0-9,]{0,40}(?:\.[0-9]{1,20})?|[-+]?\.[0-9]{1,20})")
_NUMBER = re.compile(r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|[-+]?\.[0-9]+")
_FRACTION = re.compile(r"([-+]?)\\[dt]?frac\{([-+]?[0-9]+)\}\{([-+]?[0-9]+)\}|([-+]?[0-9]+)/([0-9]+)")


def last_boxed(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched; None if absent or too long.

    Returns None when the content exceeds `max_chars`, nests braces deeper than MAX_BRACE_DEPTH, or is unbalanced,
    so hostile completions (megabyte boxes, 10,000-deep `\\frac`) are rejected after a short scan.
    """
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":  # "\boxed 5": up to the next space or "$"
        m = re.match(r"[^\s${}]{1,64}", text[i : i + 65])
        return m.group(0) if m else None
    j = _closing_brace(text, i, min(n, i + max_chars + 2))
    if j is None:  # unbalanced, longer than max_chars or nested too deep
        return None
    return text[i + 1 : j].strip() or None


def _closing_brace(text: str, i: int, end: int) -> int | None:
    """Index of the `}` matching the `{` at `text[i]`, searched before `end`; None when unbalanced there or nested
    deeper than MAX_BRACE_DEPTH (a short scan, whatever the input)."""
    depth = 0
    for j in range(i, end):
        c = text[j]
        if c == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


MAX_BOXES = 16  # final_boxed joins at most this many boxes
_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")


def _box_at(text: str, start: int, stop: int, max_chars: int) -> tuple[str, int] | None:
    """(content, index of its closing brace) of the `\\boxed{`/`\\fbox{` starting at `start`, braces matched before
    `stop`; None when it has no brace, is unbalanced there, longer than `max_chars` or nested too deep."""
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < stop and text[i].isspace():
        i += 1
    if i >= stop or text[i] != "{":
        return None
    j = _closing_brace(text, i, min(stop, i + max_chars + 2))
    return None if j is None else (text[i + 1 : j].strip(), j)


def final_boxed(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The final boxed answer as math-verify reads it: the last `\\boxed{}` / `\\fbox{}`, joined by "," with the boxes
    right before it that belong to the same answer; None if there is none (or it is empty, unbalanced, too long).

    A box before an already taken one joins the answer when the text between them is shorter than 10 characters,
    or shorter than 70, contains "and", "or", "," or ";", and the two contents differ
    (latex2sympy2_extended's `extract_boxed_content(mode="last")`, which math-verify applies to a `\\boxed` answer).
    Repeated equal neighbours count once. `\\boxed{3} and \\boxed{5}` -> "3,5"; `\\boxed{1}. Let me check ...
    the answer is \\boxed{2}` -> "2". Bounded: at most MAX_BOXES boxes and `max_chars` characters in all.
    """
    if not isinstance(text, str):
        return None
    results: list[str] = []
    stop = len(text)
    later_start = -1  # start of the box taken last (to the right)
    total = 0
    while len(results) < MAX_BOXES:
        start = max(text.rfind("\\boxed", 0, stop), text.rfind("\\fbox", 0, stop))
        if start < 0:
            break
        box = _box_at(text, start, stop, max_chars)
        if box is None:
            if not results:
                return last_boxed(text[:stop], max_chars) if text.startswith("\\boxed", start) else None
            break
        content, close = box
        if results:
            between = text[close + 1 : later_start]
            joins = len(between) < 10 or (
                content != results[-1] and len(between) < 70 and _SEPARATOR.search(between) is not None
            )
            if not joins:
                break
        if not results or results[-1] != content:
            results.append(content)
            total += len(content) + 1
            if total > max_chars + 1:
                return None
        later_start = start
        stop = start
    if not results or not results[0]:
        return None
    return ",".join(reversed(results))


def hash_answer(text: str) -> str | None:
    """The number after the last `####` (GSM8K style), commas removed; None when absent or not a number."""
    if not isinstance(text, str):
        return None
    k = text.rfind("####")
    if k < 0:
        return None
    m = _HASH_NUMBER.match(text, k + 4, k + 4 + 80)
    if not m:
        return None
    return m.group(1).replace(",", "")


def parse_number(text: str) -> Fraction | None:
    """An exact rational for "12", "-3.5", "1,234", "$7", "50%", "3/4", "\\frac{3}{4}", "\\text{12}"; else None."""
    if not isinstance(text, str) or len(text) > MAX_NUMBER_CHARS:
        return None
    s = text.strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "").strip()
    s = s.rstrip(".").strip()
    if not s:
        return None
    m = _FRACTION.fullmatch(s)
    if m:
        if m.group(2) is not None:
            num, den = int(m.group(2)), int(m.group(3))
            sign = -1 if m.group(1) == "-" else 1
        else:
            num, den, sign = int(m.group(4)), int(m.group(5)), 1
        return None if den == 0 else sign * Fraction(num, den)
    if _NUMBER.fullmatch(s):
        return Fraction(s.replace(",", ""))
    return None


def parse_int(text: str) -> int | None:
    """An integer for "12", "-7", "1,234", "12.0"; None for non-integers and anything else."""
    value = parse_number(text)
    if value is None or value.denominator != 1:
        return None
    return int(value)
