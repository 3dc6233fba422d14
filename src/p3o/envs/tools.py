"""Tools: calls parsed from a model turn, run in killable worker processes with a hard per-call time limit.

A model turn may call a tool in the built-in tiny model's plain markup, ``<calc>EXPR</calc>``, or Qwen3-style,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several per turn, capped). A malformed call is a
`ParseError` in the parse result, never an exception. Calls run outside the trainer's process in a small pool of
worker processes (`p3o.envs.tool_worker`, the `p3o.rewards.sandbox.Worker` pattern: JSON lines, killed on overrun,
a warm spare, PDEATHSIG), so a tool that raises, hangs or floods gives an observation text and a counted error:

    runner = ToolRunner([CALCULATOR], timeout_s=2.0, max_output_chars=2000)
    calls = parse_tool_calls("4821 * 37 = <calc>4821 * 37</calc>", style="calc")
    [result] = runner.run_many(calls)          # ToolResult(name="calc", output="178377", status="ok", ...)
    info = tool_info([result])                 # {"tool_calls": 1.0, "tool_errors": 0.0, ...} (`Step.info`)

A tool is a `Tool` record (name, OpenAI function-format schema, the function the worker calls); your own is
``package.module:function`` (`load_tool`), a function ``fn(arguments: dict) -> str`` or a `Tool` object.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from p3o.errors import ConfigError
from p3o.rewards.sandbox import Worker

__all__ = [
    "CALCULATOR",
    "STYLES",
    "ParseError",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolRunner",
    "calculate",
    "calculator",
    "cut_text",
    "load_tool",
    "parse_tool_calls",
    "shared_runner",
    "tool_info",
]

STYLES = ("calc", "qwen")
"""Tool-call markups `parse_tool_calls` reads: ``calc`` (``<calc>EXPR</calc>``), ``qwen`` (``<tool_call>{json}``)."""

MAX_EXPR_CHARS = 200  # the calculator's input cap
MAX_BITS = 1024  # numerator / denominator size cap of every calculator value (~308 digits)
_CALC = re.compile(r"<calc>(.*?)</calc>", re.S)
_CALC_OPEN = re.compile(r"<calc>(?![\s\S]*?</calc>)", re.S)
_QWEN = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_QWEN_OPEN = re.compile(r"<tool_call>(?![\s\S]*?</tool_call>)", re.S)
_MARKUP = {
    "calc": (_CALC, _CALC_OPEN, "<calc>", "</calc>"),
    "qwen": (_QWEN, _QWEN_OPEN, "<tool_call>", "</tool_call>"),
}
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<name>[A-Za-z_]\w*)$")


# ------------------------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool a model may call.

    Attributes:
        name: the name calls use (``<tool_call>{"name": name, ...}``; the calc markup calls ``calc``).
        schema: the OpenAI function-format declaration (verl / TRL): ``{"type": "function", "function": {"name",
            "description", "parameters": JSON-Schema}}``; passed to ``apply_chat_template(tools=...)``.
        fn: ``fn(arguments: dict) -> str``, the function itself (the worker process imports it again by `spec`).
        spec: ``package.module:attribute`` naming `fn` (or this Tool) for the worker process.
    """

    name: str
    schema: dict[str, Any]
    fn: Callable[[dict[str, Any]], Any]
    spec: str

    def run(self, arguments: dict[str, Any]) -> str:
        """``str(fn(arguments))`` in this process (the worker's body; tests)."""
        return str(self.fn(arguments))


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParseError:
    """A call that could not be read (bad JSON, no name, an unclosed tag, too many calls); counted as parse_errors."""

    message: str
    text: str = ""


@dataclass
class ToolResult:
    """The outcome of one call.

    Attributes:
        name: the tool called ("" for a parse error).
        output: the observation text the model reads (the tool's result, or ``error: ...``).
        status: "ok", "error" (the tool raised, or its worker died), "timeout" (killed at the limit), "flood" (the
            result was cut to ``max_output_chars``), "parse_error" (malformed or unknown call).
        latency_s: wall-clock seconds of the call as the caller saw it (0 for a parse error).
    """

    name: str
    output: str
    status: str = "ok"
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def tool_info(results: Sequence[ToolResult]) -> dict[str, float]:
    """The `p3o.envs.base.COUNTERS` of a step's results: calls made, errors (raised, hung or flooded), timeouts,
    parse errors, and the calls' summed latency."""
    made = [r for r in results if r.status != "parse_error"]
    return {
        "tool_calls": float(len(made)),
        "tool_errors": float(sum(r.status in ("error", "timeout", "flood") for r in made)),
        "tool_timeouts": float(sum(r.status == "timeout" for r in made)),
        "parse_errors": float(sum(r.status == "parse_error" for r in results)),
        "tool_latency_s": float(sum(r.latency_s for r in made)),
    }


# ------------------------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------------------------


def parse_tool_calls(text: str, style: str = "qwen", max_calls: int = 4) -> list[ToolCall | ParseError]:
    """The tool calls of one model turn, in order; [] when the turn calls nothing (its final answer).

    Args:
        text: the decoded turn (special tokens kept).
        style: "calc": ``<calc>EXPR</calc>`` → ``ToolCall("calc", {"expression": EXPR})``; "qwen":
            ``<tool_call>{"name": str, "arguments": {...}}</tool_call>`` (``arguments`` may also be a JSON string).
        max_calls: calls kept per turn; more give one ParseError after the first `max_calls`.

    Never raises on model text: an unclosed tag, invalid JSON or a call without a name is a `ParseError`.
    """
    if style not in STYLES:
        raise ConfigError(f"tool-call style {style!r}: known: {', '.join(STYLES)}")
    out: list[ToolCall | ParseError] = []
    pattern, unclosed, open_tag, close_tag = _MARKUP[style]
    matches = list(pattern.finditer(text))
    for m in matches:
        out.append(ToolCall("calc", {"expression": m.group(1).strip()}) if style == "calc" else _qwen_call(m.group(1)))
    if unclosed.search(text):
        out.append(ParseError(f"error: {open_tag} without {close_tag}", text[-80:]))
    if text.count(close_tag) > len(matches):  # e.g. a turn that stopped at </calc> without opening a call
        out.append(ParseError(f"error: {close_tag} without {open_tag}", text[-80:]))
    if len(out) > max_calls:
        out = [*out[:max_calls], ParseError(f"error: at most {max_calls} tool calls per turn; {len(out)} given")]
    return out


def _qwen_call(body: str) -> ToolCall | ParseError:
    try:
        obj = json.loads(body.strip())
    except (json.JSONDecodeError, RecursionError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deep"
        return ParseError(f"error: the tool call is not valid JSON ({msg})", body[:80])
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ParseError('error: a tool call is {"name": "...", "arguments": {...}}', body[:80])
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ParseError("error: the tool call's arguments are not a JSON object", body[:80])
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ParseError("error: the tool call's arguments are not a JSON object", body[:80])
    return ToolCall(obj["name"], args)


# ------------------------------------------------------------------------------------------------------------------
# The calculator: safe evaluation with `ast` (never eval / exec)
# ------------------------------------------------------------------------------------------------------------------


def _check(x: Fraction) -> Fraction:
    if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
        raise OverflowError("result too large")
    return x


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise ValueError("exponent must be an integer")
    e = exp.numerator
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if abs(e) > 4 * MAX_BITS or (size > 1 and (size - 1) * abs(e) > MAX_BITS):
        raise OverflowError("result too large")
    if base == 0 and e < 0:
        raise ZeroDivisionError("zero to a negative power")
    return _check(base**e)


def _nonzero(b: Fraction) -> Fraction:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return b


_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / _nonzero(b),
    ast.FloorDiv: lambda a, b: Fraction(a // _nonzero(b)),
    ast.Mod: lambda a, b: a % _nonzero(b),
    ast.Pow: _power,
}


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression: integers and decimals, ``+ - * / // % **`` (bounded exponents),
    parentheses, unary minus / plus. Nothing else parses: no names, calls, attributes, strings, floats in exponent
    notation. Values are exact fractions (``1/3 * 3 == 1``); every value is capped at MAX_BITS bits.

    Raises ValueError (not arithmetic), ZeroDivisionError, OverflowError (too large / too long); never evaluates code.
    """
    if not isinstance(expression, str):
        raise ValueError("the expression must be a string")
    if len(expression) > MAX_EXPR_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPR_CHARS} characters")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise ValueError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression.strip()[:40]!r}") from None

    def value(node: ast.AST, depth: int) -> Fraction:
        if depth > 50:
            raise ValueError("expression nested too deep")
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            literal = ast.get_source_segment(text, node) or ""
            if not _NUMBER.match(literal):
                raise ValueError(f"not a plain decimal number: {literal[:20]!r}")
            return _check(Fraction(literal))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            x = value(node.operand, depth + 1)
            return -x if isinstance(node.op, ast.USub) else x
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = value(node.left, depth + 1), value(node.right, depth + 1)
            return _check(_BINARY[type(node.op)](a, b))
        what = type(node.op).__name__ if isinstance(node, ast.BinOp | ast.UnaryOp) else type(node).__name__
        raise ValueError(f"not allowed in an expression: {what} (use + - * / // % ** and parentheses)")

    return value(tree.body, 0)


def format_number(x: Fraction, places: int = 10) -> str:
    """An exact integer when integral (``178377``), else a decimal rounded to `places` places (``0.3333333333``)."""
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    scaled = round(abs(x) * 10**places)
    whole, frac = divmod(scaled, 10**places)
    return f"{sign}{whole}.{frac:0{places}d}".rstrip("0").rstrip(".") or "0"


def calculator(arguments: dict[str, Any]) -> str:
    """The calculator tool: ``{"expression": "4821 * 37"}`` → ``"178377"`` (see `calculate`)."""
    if not isinstance(arguments, dict) or "expression" not in arguments:
        raise ValueError('expected {"expression": "..."}')
    return format_number(calculate(str(arguments["expression"])))


CALCULATOR = Tool(
    name="calc",
    schema={
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression exactly (+ - * / // % **, parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 4821 * 37"}},
                "required": ["expression"],
            },
        },
    },
    fn=calculator,
    spec="p3o.envs.tools:calculator",
)


# ------------------------------------------------------------------------------------------------------------------
# User tools
# ------------------------------------------------------------------------------------------------------------------


def _import_module(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        # the `p3o` console script does not put the working directory on sys.path; `python -m` does
        if err.name != module.split(".")[0] or os.getcwd() in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(module)


def resolve_spec(spec: str, what: str = "tool") -> Any:
    """The object `package.module:name` names; ConfigError (one line) when it cannot be imported."""
    m = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise ConfigError(f"{what} {spec!r}: expected 'package.module:name'")
    try:
        mod = _import_module(m.group("module"))
    except BaseException as err:
        module = m.group("module")
        raise ConfigError(f"{what} {spec!r}: cannot import {module} ({type(err).__name__}: {err})") from None
    obj = getattr(mod, m.group("name"), None)
    if obj is None:
        raise ConfigError(f"{what} {spec!r}: {m.group('module')} has no attribute {m.group('name')!r}")
    return obj


def load_tool(spec: str) -> Tool:
    """The tool `package.module:name` names: a `Tool` object, or a function ``fn(arguments: dict) -> str`` (its name
    is the tool's name; its schema is ``fn.schema`` when it has one, else built from the docstring, no parameters).

    ConfigError (one line) when it cannot be imported or is neither.
    """
    obj = resolve_spec(spec)
    if isinstance(obj, Tool):
        return Tool(obj.name, obj.schema, obj.fn, spec.strip())
    if not callable(obj):
        raise ConfigError(f"tool {spec!r}: not a function or a p3o.envs.tools.Tool")
    name = getattr(obj, "__name__", spec.rpartition(":")[2])
    schema = getattr(obj, "schema", None)
    if not isinstance(schema, dict):
        doc = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
        schema = {"type": "function", "function": {"name": name, "description": doc, "parameters": {"type": "object"}}}
    return Tool(str(schema.get("function", {}).get("name", name)), schema, obj, spec.strip())


# ------------------------------------------------------------------------------------------------------------------
# Running calls: a pool of killable workers
# ------------------------------------------------------------------------------------------------------------------


def cut_text(text: str, max_chars: int) -> tuple[str, int]:
    """(`text` cut in the middle to `max_chars` characters plus a visible marker, characters cut); uncut: (text, 0)."""
    if len(text) <= max_chars:
        return text, 0
    cut = len(text) - max_chars
    head = max_chars - max_chars // 2
    return f"{text[:head]}…[cut {cut} chars]…{text[len(text) - max_chars // 2 :] if max_chars // 2 else ''}", cut


class ToolRunner:
    """Runs tool calls in `workers` worker processes, in parallel, each call with a hard `timeout_s` limit.

    Thread-safe: episodes stepped from several threads share the pool. The processes are started on first use, from
    the runner's own long-lived threads (PDEATHSIG follows the thread that started a child), and stay up until
    `close`.

    Args:
        tools: the tools calls may name.
        timeout_s: wall-clock limit of one call (``agent.tool_timeout_s``); a call past it is killed.
        max_output_chars: characters of a result kept (``agent.max_tool_output_chars``); more is cut, with a
            marker, and counted as an error.
        workers: processes in the pool (calls beyond it wait for a free one; their wait is not charged).
        latency_s: an artificial delay inside each call (benchmarks: a slow tool).
        start_timeout_s: how long the first start of a worker may take.
        memory_gib: address-space cap of each worker process (a tool that allocates past it gets a MemoryError,
            which the model reads as an error); None: no cap.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        timeout_s: float = 2.0,
        max_output_chars: int = 2000,
        workers: int = 2,
        latency_s: float = 0.0,
        start_timeout_s: float = 60.0,
        memory_gib: float | None = 8.0,
    ) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"agent.tool_timeout_s: must be > 0, got {timeout_s}")
        if int(max_output_chars) < 1 or int(workers) < 1 or latency_s < 0:
            raise ConfigError(
                f"tool runner: max_output_chars and workers must be >= 1, latency_s >= 0; got {max_output_chars}, "
                f"{workers}, {latency_s}"
            )
        self.tools = {t.name: t for t in tools}
        self.timeout_s = float(timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.latency_s = float(latency_s)
        paths = [p if p else os.getcwd() for p in sys.path]
        args = (json.dumps(sorted({t.spec for t in tools})), json.dumps(paths), json.dumps(memory_gib))
        self._workers = [
            Worker("p3o.envs.tool_worker", start_timeout_s=start_timeout_s, args=args) for _ in range(int(workers))
        ]
        self._free: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for w in self._workers:
            self._free.put(w)
        self._pool = ThreadPoolExecutor(max_workers=int(workers), thread_name_prefix="p3o-tools")
        self._lock = threading.Lock()
        self.closed = False

    def run_many(self, calls: Sequence[ToolCall | ParseError]) -> list[ToolResult]:
        """One `ToolResult` per call, in order; the calls run in parallel (parse errors and unknown tools answer at
        once). Never raises for anything a model wrote or a tool did."""
        if self.closed:
            raise RuntimeError("p3o.envs: this ToolRunner is closed")
        results: list[ToolResult | None] = [None] * len(calls)
        futures = {}
        for i, call in enumerate(calls):
            if isinstance(call, ParseError):
                results[i] = ToolResult("", call.message, "parse_error")
            elif call.name not in self.tools:
                known = ", ".join(sorted(self.tools)) or "none"
                results[i] = ToolResult(call.name, f"error: unknown tool {call.name!r}; known: {known}", "parse_error")
            else:
                futures[i] = self._pool.submit(self._run_one, call)
        for i, fut in futures.items():
            try:
                results[i] = fut.result()
            except Exception as err:  # a bug on this side must not end the episode, let alone the run
                name = getattr(calls[i], "name", "")
                results[i] = ToolResult(name, f"error: {type(err).__name__}: {err}", "error")
        return [r for r in results if r is not None]

    def start(self) -> None:
        """Start every worker process now, in parallel (else the first calls wait for them)."""
        futures = [self._pool.submit(self._ping) for _ in self._workers]
        for fut in futures:
            fut.result()

    def _ping(self) -> None:
        worker = self._free.get()
        try:
            worker.request({"ping": True}, timeout_s=self.timeout_s)
        except Exception:  # a worker that cannot start is reported by the first real call
            pass
        finally:
            self._free.put(worker)

    def run(self, call: ToolCall | ParseError) -> ToolResult:
        """`run_many` of one call."""
        return self.run_many([call])[0]

    def _run_one(self, call: ToolCall) -> ToolResult:
        worker = self._free.get()
        try:
            tool = self.tools[call.name]
            request = {
                "spec": tool.spec,
                "arguments": call.arguments,
                "latency_s": self.latency_s,
                "max_chars": self.max_output_chars,
            }
            t0 = time.perf_counter()
            try:
                status, value = worker.request(request, timeout_s=self.timeout_s)
            except Exception as err:  # the worker did not start
                status, value = "error", f"{type(err).__name__}: {err}"
            latency = time.perf_counter() - t0
        finally:
            self._free.put(worker)
        if status == "timeout":
            return ToolResult(call.name, f"error: timeout after {self.timeout_s:g}s", "timeout", latency)
        if status != "ok":
            return ToolResult(call.name, f"error: {value}", "error", latency)
        output, cut = str(value.get("output", "")), int(value.get("cut", 0))
        return ToolResult(call.name, output, "flood" if cut else "ok", latency)

    def close(self) -> None:
        """Kill the worker processes (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for w in self._workers:
            w.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple[Any, ...], ToolRunner] = {}
_SHARED_LOCK = threading.Lock()


def shared_runner(
    tools: Sequence[Tool],
    timeout_s: float = 2.0,
    max_output_chars: int = 2000,
    latency_s: float = 0.0,
    workers: int = 2,
) -> ToolRunner:
    """The process-wide `ToolRunner` for these settings (made once; episodes share it, `env.close` leaves it up)."""
    key = (tuple(sorted(t.spec for t in tools)), float(timeout_s), int(max_output_chars), float(latency_s), workers)
    with _SHARED_LOCK:
        runner = _SHARED.get(key)
        if runner is None or runner.closed:
            runner = _SHARED[key] = ToolRunner(tools, timeout_s, max_output_chars, workers, latency_s)
            runner.start()
        return runner
