"""`verifiers` environments as p3o harnesses (``agent.harness: verifiers:<module>``).

``<module>`` is a verifiers v1 taskset id: an importable module that exports one ``vf.Taskset`` subclass in its
``__all__`` (verifiers' own rule, `verifiers.v1.utils.loaders`), e.g. ``verifiers:p3o.examples.verifiers_calc``. p3o
runs it through verifiers' own API, in this process:

- the environment is ``vf.load_environment(EnvConfig)`` (its taskset, its ``Task`` rewards and metrics, its tool
  servers: ``Taskset.toolsets`` started once for the run, ``Task.toolsets`` per episode, each a local subprocess);
- the run's problems are the taskset's own rows (`VerifiersHarness.problems`: the last ``n_eval`` rows held out, the
  rows before them trained on; ``Problem.meta["verifiers_task"]`` is the row's position);
- one p3o episode is one ``Env.run_episode(task, ModelContext)`` whose client is ``vf.EvalClientConfig`` pointed at
  the episode's base URL on p3o's endpoint: verifiers' interception server forwards each chat completion unchanged,
  so p3o's server records every sampled token (ids, log-prob, version) under the episode's key, and the trainer's
  rows come from those records (never from verifiers' trace);
- the seat's program is `CHAT_HARNESS` (``p3o_chat``), a ``vf.Harness`` that runs the tool-calling chat loop in this
  process against verifiers' interception endpoint (verifiers' contract: "a harness may run its loop in-process ...
  as long as every model call goes through ``endpoint`` + ``secret``"), calling the taskset's MCP tools with
  verifiers' own MCP client (`verifiers.v1.harnesses.utils.mcp`). Verifiers' default seat (``bash``, a PEP 723
  script that ``uv`` installs from PyPI, in a remote Prime sandbox) would download at run time; a taskset that
  bundles its own harness keeps it, on the local subprocess runtime.
- the tools the seat sends are the MCP servers' tools as OpenAI function tools (verifiers' ``connect_mcp``), each
  with its parameters' descriptions taken from its docstring's Google-style ``Args:`` section where MCP gives none
  (`described`, as `transformers`' ``get_json_schema`` reads a docstring; the tool's description is then the text
  before the section), then without MCP's ``title`` keys (`untitled`). MCP reads a parameter's description only from
  pydantic (``Annotated[str, Field(description=...)]``), so an environment that imports only verifiers writes::

      @vf.tool
      def calculator(self, expression: str) -> str:
          '''Evaluate an arithmetic expression.

          Args:
              expression: e.g. 47 * 6
          '''

The harness returns the episode's reward (``Trace.reward``: the weighted sum of the task's ``@vf.reward``\\ s) and its
numeric ``@vf.metric``\\ s plus ``vf_turns``; an episode verifiers marks failed (an error, a timeout) raises, so p3o
counts it (``error``) and trains nothing of it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import math
import os
import sys
import threading
import types
from contextlib import AsyncExitStack
from typing import Any

from transformers.utils.chat_template_utils import parse_google_format_docstring

from p3o.errors import ConfigError, P3OError
from p3o.tasks.base import Problem

__all__ = ["CHAT_HARNESS", "KEY_VAR", "MAX_TOKENS", "MAX_TURNS", "VerifiersHarness", "load_verifiers"]

CHAT_HARNESS = "p3o_chat"
"""The verifiers harness id of p3o's in-process chat loop (a module verifiers imports by this name)."""

KEY_VAR = "P3O_SERVE_API_KEY"
"""The environment variable verifiers' client reads the endpoint's key from (``api_key_var``; verifiers' subprocess
runtime strips every variable whose name contains ``API_KEY`` from the programs it starts)."""

MAX_TURNS = 3
"""Model calls per episode at most (the seat's ``max_turns``), as the openai-SDK example."""

MAX_TOKENS = 64
"""``max_tokens`` of each model call (the seat's sampling; verifiers' client owns the sampling fields)."""

_LOADED: dict[str, VerifiersHarness] = {}


def load_verifiers(module: str) -> VerifiersHarness:
    """The harness that runs the `verifiers` environment ``module`` against p3o's endpoint (one per module and
    process: `p3o.train.wiring.harness_problems` reads its problems and runs its episodes). Bad input: one-line
    ConfigError."""
    if module not in _LOADED:
        _LOADED[module] = VerifiersHarness(module)
    return _LOADED[module]


def _spec(module: str) -> str:
    return f"agent.harness: 'verifiers:{module}'"


def _import_vf(module: str) -> Any:
    try:
        import verifiers.v1 as vf  # optional: the verifiers extra
    except ImportError as exc:
        raise ConfigError(
            f"{_spec(module)} needs the verifiers extra (pip install -e '.[verifiers]'): {exc}"
        ) from None
    return vf


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _taskset_id(vf: Any, module: str) -> str:
    """The verifiers taskset id of ``module``: the module itself when verifiers can import it by that name, else
    (a dotted path: verifiers resolves an id as one top-level name) a flat alias (``a.b.c`` -> ``a_b_c``)."""
    if not module or any(not part.isidentifier() for part in module.split(".")):
        raise ConfigError(f"{_spec(module)}: <module> must be an importable module path (e.g. my_env)")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # a user module's import error, named in one line
        raise ConfigError(f"{_spec(module)}: cannot import {module!r} ({_one_line(exc)})") from None
    names = getattr(mod, "__all__", None) or []
    found = [o for n in names if isinstance(o := getattr(mod, n, None), type) and issubclass(o, vf.Taskset)]
    if len(found) != 1:
        raise ConfigError(
            f"{_spec(module)}: {module!r} is not a verifiers environment (it must export exactly one vf.Taskset "
            f"subclass in __all__; found {len(found)})"
        )
    if "." not in module:
        return module
    alias = module.replace(".", "_").lower()
    if sys.modules.setdefault(alias, mod) is not mod:
        raise ConfigError(f"{_spec(module)}: the alias {alias!r} verifiers would import is another module")
    return alias


class VerifiersHarness:
    """A verifiers environment as a p3o harness: ``await harness(client, model, problem)`` runs one episode.

    The environment's serving resources (verifiers' interception server, the taskset's tool servers) live on an
    event loop of their own, in a daemon thread, for the whole run; each episode runs there
    (``asyncio.run_coroutine_threadsafe``), awaited from the caller's loop (cancelling it, e.g. at p3o's episode
    time limit, cancels the episode).
    """

    def __init__(self, module: str) -> None:
        vf = _import_vf(module)
        self.module, self.vf = module, vf
        taskset_id = _taskset_id(vf, module)
        _register_chat_harness(vf)
        agent: dict[str, Any] = {
            "runtime": {"type": "subprocess"},
            "max_turns": MAX_TURNS,
            "sampling": {"max_tokens": MAX_TOKENS},
        }
        if vf.default_harness_id(taskset_id) == "bash":  # the taskset bundles no harness of its own
            agent["harness"] = {"id": CHAT_HARNESS}
        try:
            config = vf.resolve_env_config({"taskset": {"id": taskset_id}, "agent": agent})
            self.env = vf.load_environment(config)
            if not self.env.taskset.bounded:
                raise ValueError("its taskset is infinite; bound it (include idx ranges) to train on it")
            self.tasks = list(self.env.taskset)
        except ConfigError:
            raise
        except Exception as exc:  # verifiers' own validation of the environment, in one line
            raise ConfigError(f"{_spec(module)}: the environment does not load ({_one_line(exc)})") from None
        if not self.tasks:
            raise ConfigError(f"{_spec(module)}: its taskset has no rows")
        self.sampling: dict[str, Any] = {"max_tokens": MAX_TOKENS}
        """The sampling fields every model call of an episode carries (verifiers' ``SamplingConfig``, which passes
        other keys through to p3o's endpoint: ``seed`` makes each call's draws depend on its prompt and seed only)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serving: asyncio.Future[None] | None = None
        self._holder: asyncio.Task[None] | None = None
        self._lock = threading.Lock()

    def problems(self, n_train: int | None, n_eval: int) -> tuple[list[Problem], list[Problem]]:
        """(training, held-out) problems: the taskset's rows in its order, the last ``n_eval`` held out, at most
        ``n_train`` of the rows before them trained on (all when None). A row's ``prompt`` is its prompt text,
        ``answer`` its ``answer`` field when it has one (rewards are the environment's, not p3o's)."""
        rows = [
            Problem(
                prompt=t.data.prompt_text,
                answer=str(getattr(t.data, "answer", "") or ""),
                meta={"verifiers_task": i, "source": f"verifiers:{self.module}", "index": i},
            )
            for i, t in enumerate(self.tasks)
        ]
        n_eval = max(0, min(int(n_eval), len(rows) - 1))
        train = rows[: len(rows) - n_eval]
        return (train if n_train is None else train[: int(n_train)]), rows[len(rows) - n_eval :]

    async def __call__(self, client: Any, model: str, problem: Problem) -> dict[str, float]:
        """One episode of ``problem``'s row through the episode's ``client`` (its base URL and key): the
        environment's reward and numeric metrics. A failed verifiers episode raises (p3o counts it)."""
        index = problem.meta.get("verifiers_task") if isinstance(problem.meta, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(self.tasks):
            raise P3OError(f"verifiers:{self.module}: the problem names no row of its taskset")
        os.environ[KEY_VAR] = str(client.api_key)  # the run's one key (verifiers' client reads it from here)
        ctx = self.vf.ModelContext(
            model=model,
            client=self.vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=KEY_VAR),
            sampling=self.vf.SamplingConfig(**self.sampling),
        )
        loop = self._start()
        future = asyncio.run_coroutine_threadsafe(self._episode(self.tasks[index], ctx), loop)
        episode = await asyncio.wrap_future(future)
        return vf_episode_result(episode)

    async def _episode(self, task: Any, ctx: Any) -> Any:
        assert self._serving is not None
        await asyncio.shield(self._serving)  # the serving resources are up (or their start failed: raises)
        return await self.env.run_episode(task, ctx)

    def _start(self) -> asyncio.AbstractEventLoop:
        """The serving loop, started on first use: a daemon thread entering ``env.serving()`` until `close`."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._serving = loop.create_future()
                threading.Thread(target=self._serve, args=(loop,), name="p3o-verifiers", daemon=True).start()
                self._loop = loop
                atexit.register(self.close)
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        self._holder = loop.create_task(self._hold())
        loop.run_forever()

    async def _hold(self) -> None:
        assert self._serving is not None
        try:
            async with self.env.serving():
                self._serving.set_result(None)
                await asyncio.Event().wait()  # until close() cancels it
        except BaseException as exc:
            if not self._serving.done():
                self._serving.set_exception(P3OError(f"verifiers:{self.module}: serving failed ({_one_line(exc)})"))
            if not isinstance(exc, (asyncio.CancelledError, Exception)):
                raise

    def close(self, timeout_s: float = 15.0) -> None:
        """Tear the serving resources down (tool servers, interception) and stop the loop; idempotent."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return

        async def stop() -> None:
            if self._holder is not None:
                self._holder.cancel()
                await asyncio.gather(self._holder, return_exceptions=True)

        with contextlib.suppress(Exception):  # best effort at exit: the tool servers die with this process anyway
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)


def vf_episode_result(episode: Any) -> dict[str, float]:
    """A finished verifiers ``Episode`` as a p3o harness result: ``reward`` (its trace's reward; the mean over
    traces for a multi-agent episode), each finite numeric metric, and ``vf_turns`` (sampled turns). A failed
    episode (``not episode.ok``) raises P3OError naming verifiers' error."""
    if not episode.ok or not episode.traces:
        error = episode.last_error or next((t.last_error for t in episode.traces if t.last_error), None)
        status = f" {error.status_code}" if error is not None and error.status_code else ""
        why = f"{error.type}{status}: {' '.join(str(error.message).split())[:300]}" if error else "no finished trace"
        raise P3OError(f"the verifiers episode failed ({why})")
    out: dict[str, float] = {"reward": sum(t.reward for t in episode.traces) / len(episode.traces)}
    for trace in episode.traces:
        for name, value in trace.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out[f"vf_{name}"] = out.get(f"vf_{name}", 0.0) + float(value) / len(episode.traces)
    out["vf_turns"] = float(episode.num_turns)
    return out


def _register_chat_harness(vf: Any) -> None:
    """Make `CHAT_HARNESS` importable by verifiers (a module exporting one ``vf.Harness`` subclass in ``__all__``)."""
    if CHAT_HARNESS in sys.modules:
        return
    module = types.ModuleType(CHAT_HARNESS, "p3o's in-process chat loop as a verifiers harness")
    module.P3OChatHarness = _chat_harness_class(vf)  # type: ignore[attr-defined]
    module.__all__ = ["P3OChatHarness"]  # type: ignore[attr-defined]
    sys.modules[CHAT_HARNESS] = module


def _chat_harness_class(vf: Any) -> type:
    """The ``vf.Harness`` subclass of `CHAT_HARNESS` (built once verifiers is imported: it is an optional extra)."""

    class P3OChatHarness(vf.Harness[vf.HarnessConfig]):
        """A tool-calling chat loop run in this process against verifiers' interception endpoint: the model is
        called with the task's MCP tools until it answers without a tool call (or a verifiers limit stops it)."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_MCP = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
            system, prompt = self.resolve_prompt(data)
            messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [vf_wire(m) for m in prompt or []]
            await chat_loop(self.config, ctx.model, endpoint, secret, mcp_urls, messages, trace)
            return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    return P3OChatHarness


def vf_wire(message: Any) -> dict[str, Any]:
    """A verifiers message as an OpenAI chat message (verifiers' own ``message_to_wire``)."""
    from verifiers.v1.dialects.chat import message_to_wire  # optional: the verifiers extra

    return message_to_wire(message)


async def chat_loop(
    config: Any, model: str, endpoint: str, secret: str, mcp_urls: dict[str, str], messages: list[dict], trace: Any
) -> None:
    """Call the model at ``endpoint`` with the MCP servers' tools (verifiers' MCP client: `connect_mcp`,
    `call_mcp`) until a reply without tool calls; a call refused because a verifiers limit or ``@vf.stop`` ended the
    rollout (``trace.stop_condition`` set) ends the loop, any other error raises (the episode fails)."""
    # optional: httpx and openai (the serve extra), verifiers' MCP client (the verifiers extra)
    import httpx
    import openai
    from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

    # no read limit (p3o's episode time limit bounds the episode); a connect limit that a loaded box's serving
    # loop, accepting many episodes' connections at once, does not hit (openai's 5 s did: 1 held-out episode of 256)
    timeout = httpx.Timeout(None, connect=60.0)
    client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=timeout)
    servers_config = {"mcpServers": {n: {"url": u, "timeout": config.tool_timeout} for n, u in mcp_urls.items()}}
    async with AsyncExitStack() as stack:
        stack.push_async_callback(client.close)
        tools, dispatch, servers = await connect_mcp(servers_config, stack) if mcp_urls else ([], {}, {})
        tools = [untitled(described(tool)) for tool in tools]
        while True:
            try:
                kwargs = {"tools": tools} if tools else {}
                reply = await client.chat.completions.create(model=model, messages=messages, **kwargs)
            except openai.APIError:
                if trace.stop_condition is not None:
                    return
                raise
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                content = await _tool_result(call, dispatch, servers, call_mcp)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})


def described(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool (``{"type": "function", "function": {"name", "description", "parameters"}}``) whose
    description is a Google-style docstring with an ``Args:`` section (``name: text`` lines, ``name (type): text``
    too): the section's text becomes the description of each parameter that has none, and the tool's description
    the text before the section, as `transformers`' ``get_json_schema`` writes a function's schema. A parameter
    described already (pydantic's ``Field``) keeps its description; a name that is no parameter is ignored; a tool
    without the section is returned as it is. The input is not modified."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("description"), str):
        return tool
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    head, args, _ = parse_google_format_docstring(function["description"])
    if not args or not isinstance(properties, dict):
        return tool
    filled = {
        name: {**prop, "description": args[name]}
        if isinstance(prop, dict) and "description" not in prop and args.get(name)
        else prop
        for name, prop in properties.items()
    }
    parameters = {**parameters, "properties": filled}
    return {**tool, "function": {**function, "description": head or "", "parameters": parameters}}


def untitled(schema: Any) -> Any:
    """A tool's JSON schema as OpenAI's function tools write it: without the ``title`` keys MCP's pydantic derives
    from Python names (``calculatorArguments``, ``Expression``: no part of the tool's contract) and with ``type``
    first in each object (pydantic writes it after ``description``). The model sees the schema as text, so its
    tokens are what a chat model was shown for tools (tiny-chat: the openai-SDK example's)."""
    if isinstance(schema, dict):
        items = [(k, untitled(v)) for k, v in schema.items() if not (k == "title" and isinstance(v, str))]
        return dict(sorted(items, key=lambda kv: kv[0] != "type"))  # stable: the other keys keep their order
    if isinstance(schema, list):
        return [untitled(v) for v in schema]
    return schema


async def _tool_result(call: Any, dispatch: dict, servers: dict, call_mcp: Any) -> Any:
    """One tool call's result (an error text for bad JSON, a non-object or an unknown tool, as verifiers' loop)."""
    name = call.function.name
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError as exc:
        return f"error: invalid JSON in tool arguments ({exc})"
    if not isinstance(arguments, dict):
        return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}"
    if name not in dispatch:
        return f"error: unknown tool {name!r}"
    return await call_mcp(servers, dispatch, name, arguments)
