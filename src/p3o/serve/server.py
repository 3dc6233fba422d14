"""`EndpointServer`: the policy behind an OpenAI-compatible endpoint, every sampled token recorded per episode.

    server = EndpointServer(engine, tokenizer, model_name="tiny-agent", max_model_len=512).start()
    client = openai.OpenAI(base_url=server.episode_url("ep-1"), api_key=server.api_key)
    client.chat.completions.create(model="tiny-agent", messages=[...], tools=[...])   # token ids, log-probs, versions
    server.load_weights(trainer.state_dict(), version=1)   # between engine calls; later tokens carry version 1
    rows = server.store.pop("ep-1")                        # the episode's rows (p3o.serve.episodes.Row)
    server.stop()

The HTTP side is `p3o.serve.app`; the engine side `p3o.serve.batcher` (requests batched into engine calls); the
episode records `p3o.serve.episodes`; tool calls `p3o.serve.tools`; the wire shapes `p3o.serve.protocol`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from p3o.envs.render import Renderer
from p3o.errors import P3OError
from p3o.serve.app import build_app, check_episode
from p3o.serve.batcher import Batcher, Draw, Job
from p3o.serve.episodes import Choice, EpisodeStore, Pending, canonical
from p3o.serve.protocol import (
    Finished,
    Request,
    chat_response,
    completion_response,
    generate_response,
    read_request,
)
from p3o.serve.tools import BadRequest, resolve_tool_format, template_messages

__all__ = ["EndpointServer", "key_prefix"]

#: Sampling options that would change the distribution sampled from without the recorded log-prob knowing: refused.
UNSUPPORTED = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0, "logit_bias": None,
               "echo": False, "suffix": None, "best_of": None, "use_beam_search": False}  # fmt: skip


COUNTERS = ("requests", "ok", "unauthorized", "bad_request", "overlong", "unknown_tool_format", "wrong_model",
            "server_errors", "tool_calls", "tool_parse_errors", "unrecorded", "render_hits")  # fmt: skip
"""The server's own counters (`EndpointServer.counters` adds the store's and the batcher's)."""

RENDER_CACHE = 4096
"""Renders kept (`EndpointServer._render`): the most recently used prompts and observations, by exact messages."""


def key_prefix(key: str) -> str:
    """What may be logged of a key: its first 6 characters."""
    return f"{key[:6]}…"


class EndpointServer:
    """The endpoint (routes and fields: `p3o.serve` module docstring). Bound to `host`:`port` (0: a free port);
    `api_key` None generates one; `max_model_len` None reads the model's ``max_position_embeddings``; a request
    without ``max_tokens`` may sample up to the rest of the context, or `default_max_tokens` where given."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        model_name: str,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int | None = None,
        tool_format: str = "auto",
        window_s: float = 0.005,
        default_max_tokens: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, str(model_name)
        self.api_key = api_key or f"p3o-{secrets.token_urlsafe(24)}"
        self.host, self.port = host, int(port)
        self.max_model_len = int(max_model_len or _model_len(engine, tokenizer))
        self.default_max_tokens = int(default_max_tokens) if default_max_tokens else None
        self.tool_format = resolve_tool_format(tokenizer, tool_format)
        self.store = EpisodeStore()
        self.batcher = Batcher(engine, window_s=window_s)
        self.eos_ids = {int(i) for i in (getattr(engine, "stop_token_ids", None) or [tokenizer.eos_token_id])}
        self.log = log or (lambda line: None)
        self._counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._renderers: dict[str | None, Renderer] = {}
        self._renders: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._tok = threading.Lock()  # a fast tokenizer's encode mutates its state: one encode at a time
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    # -- life --------------------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of keyless calls (not recorded unless a header names the episode)."""
        return f"{self.url}/v1"

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode: ``<url>/episodes/<id>/v1``."""
        return f"{self.url}/episodes/{check_episode(episode_id)}/v1"

    @property
    def episode_url_template(self) -> str:
        """`episode_url` as a template, ``<url>/episodes/{episode}/v1`` (what a harness process is sent)."""
        return f"{self.url}/episodes/{{episode}}/v1"

    def start(self, sock: socket.socket | None = None) -> EndpointServer:
        """Bind (P3OError, one line, when the port is taken; or serve on `sock`, a socket `bind` made), start the
        batcher and uvicorn in a daemon thread."""
        sock = sock if sock is not None else bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.batcher.start()
        config = uvicorn.Config(  # keep-alive past 5 s: a client pool idling 5 s (verifiers') must not race a close
            build_app(self), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="p3o-serve-http")  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._uvicorn.started:
            raise P3OError(f"serve: the HTTP server did not start on {self.url}")
        self.log(f"serving {self.model_name} at {self.base_url} (key {key_prefix(self.api_key)})")
        return self

    def stop(self) -> None:
        """Stop serving (idempotent): the HTTP thread, then the batcher."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=30)
            self._uvicorn = None
        self.batcher.stop()

    def __enter__(self) -> EndpointServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_info(self, path: str | Path) -> Path:
        """Write {url, base_url, api_key, model, max_model_len} to `path` (JSON, readable by its owner only): how a
        harness started elsewhere finds the endpoint and its key."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {"url": self.url, "base_url": self.base_url, "api_key": self.api_key, "model": self.model_name,
                "max_model_len": self.max_model_len}  # fmt: skip
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(info, fh, indent=1)
        return path

    # -- weights and counters ----------------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The policy version later tokens are stamped with."""
        return int(getattr(self.engine, "version", 0))

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """New weights into the engine, between two engine calls (the engine's lock); later tokens carry `version`."""
        self.engine.load_weights(state_dict, version)

    def count(self, key: str, k: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + k

    def counters(self) -> dict[str, int]:
        """requests, ok, unauthorized (401), bad_request (400s, overlong included), overlong, unknown_tool_format,
        wrong_model (404), server_errors (500), tool_calls, tool_parse_errors, unrecorded (calls without an
        episode), the store's (split_rewrite, split_fork, rows, dropped_episodes, open_episodes) and the batcher's
        (engine_calls, batched_jobs, sampled_tokens)."""
        with self._lock:
            out = dict(self._counts)
        return {**out, **self.store.counters(), **self.batcher.counts}

    # -- routes' work ------------------------------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "p3o",
                "max_model_len": self.max_model_len, "version": self.version}  # fmt: skip
        return {"object": "list", "data": [card]}

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            self.count("wrong_model")
            raise BadRequest(f"the model '{model}' does not exist; this endpoint serves '{self.model_name}'",
                             status=404, code="model_not_found", param="model")  # fmt: skip

    def checked_request(self, body: Any, *, chat: bool) -> Request:
        """A chat or completions request's settings (`read_request`), refused in one line when it names another
        model or asks for what the endpoint does not do."""
        req = read_request(body, chat=chat)
        self.check_model(req.model)
        _refuse_unsupported(body)
        return req

    async def chat(self, body: Any, episode: str | None) -> dict[str, Any]:
        """``POST /v1/chat/completions``: render (or extend the episode's row), sample, record, answer."""
        with self.batcher.arriving() as arrived:
            return await self._chat(body, episode, arrived)

    async def _chat(self, body: Any, episode: str | None, arrived: Callable[[], None]) -> dict[str, Any]:
        req = self.checked_request(body, chat=True)
        msgs = template_messages(body.get("messages"))
        if req.tools and self.tool_format.name == "none":
            self.count("unknown_tool_format")
            raise BadRequest("'tools': this model's tokenizer speaks no known tool-call format (qwen3 '<tool_call>' "
                             "markers as single tokens, or llama3); see --tool_format", code="unknown_tool_format",
                             param="tools")  # fmt: skip
        key = json.dumps(req.tools) if req.tools else None  # key order as sent: a template prints it so
        renderer = self._renderer(req.tools, key)
        canon = [canonical(m) for m in body["messages"]]
        pending = self.store.prepare_chat(  # on the event loop: a render takes well under a millisecond
            episode, canon, key,
            lambda: self._render(key, "prompt", msgs, lambda: renderer.prompt_ids(msgs)),
            lambda k, eos: self._render(key, eos, msgs[k:], lambda: renderer.observation(msgs[k:], eos).ids),
        )  # fmt: skip
        parse = bool(req.tools) and req.tool_choice != "none"
        finished, draws = await self._serve(pending, req, arrived, parse_tools=parse)
        self.store.commit(
            pending, [_choice(f, d, self.eos_ids, canonical(_assistant(f))) for f, d in zip(finished, draws)]
        )
        return chat_response(self.model_name, pending.prompt_ids, finished, self.tokenizer, logprobs=req.logprobs,
                             episode=episode)  # fmt: skip

    async def completions(self, body: Any, episode: str | None) -> dict[str, Any]:
        """``POST /v1/completions``: a prompt (text or ids, or a list of them); each recorded as a token call."""
        with self.batcher.arriving() as arrived:
            return await self._completions(body, episode, arrived)

    async def _completions(self, body: Any, episode: str | None, arrived: Callable[[], None]) -> dict[str, Any]:
        req = self.checked_request(body, chat=False)
        prompts = self._prompts(body.get("prompt"))
        outs = []
        for p in prompts:
            pending = self.store.prepare_tokens(episode, p)
            finished, draws = await self._serve(pending, req, arrived, parse_tools=False)
            self.store.commit(pending, [_choice(f, d, self.eos_ids, None) for f, d in zip(finished, draws)])
            outs.append(finished)
        return completion_response(self.model_name, prompts, outs, self.tokenizer, logprobs=req.logprobs,
                                   episode=episode)  # fmt: skip

    async def generate(self, body: Any, episode: str | None) -> dict[str, Any]:
        """``POST /inference/v1/generate`` (vLLM's token-in-token-out route, as verifiers' TrainClient calls it)."""
        with self.batcher.arriving() as arrived:
            return await self._generate(body, episode, arrived)

    async def _generate(self, body: Any, episode: str | None, arrived: Callable[[], None]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        ids = body.get("token_ids")
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise BadRequest("'token_ids' must be a non-empty list of token ids", param="token_ids")
        self._check_ids(ids, "token_ids")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("'sampling_params' must be an object", param="sampling_params")
        self.check_model(body.get("model"))
        _refuse_unsupported(params)
        req = read_request({**params, "model": self.model_name, "logprobs": None, "stream": False}, chat=False)
        pending = self.store.prepare_tokens(episode, ids)
        finished, draws = await self._serve(pending, req, arrived, parse_tools=False)
        self.store.commit(pending, [_choice(f, d, self.eos_ids, None) for f, d in zip(finished, draws)])
        kept = [d.kept[: len(f.ids)] if d.kept is not None else None for f, d in zip(finished, draws)]
        return generate_response(pending.prompt_ids, finished, self.tokenizer, episode=episode, kept=kept)

    # -- helpers -----------------------------------------------------------------------------------------------------

    async def _serve(
        self, pending: Pending, req: Request, arrived: Callable[[], None], *, parse_tools: bool
    ) -> tuple[list[Finished], list[Draw]]:
        """Check the budget, sample, finish each choice (stops, tool calls); the pending row is freed on error."""
        try:
            budget = self._budget(len(pending.prompt_ids), req.max_tokens)
            job = Job(pending.prompt_ids, req.n, budget, req.sampling, req.top_logprobs)
            future = self.batcher.submit(job)
            arrived()
            draws = await asyncio.wrap_future(future)
            finished = [self._finish(d, req, parse_tools) for d in draws]
        except BaseException:
            self.store.abort(pending)
            raise
        if pending.reason == "unrecorded":
            self.count("unrecorded")
        return finished, draws

    def _budget(self, prompt_len: int, max_tokens: int | None) -> int:
        want = max_tokens if max_tokens is not None else self.max_model_len - prompt_len
        if max_tokens is None and self.default_max_tokens is not None:
            want = min(want, self.default_max_tokens)
        if prompt_len + max(want, 1) > self.max_model_len:
            self.count("overlong")
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + max(want, 1)} tokens ({prompt_len} in the messages, {max(want, 1)} in the "
                "completion). Please reduce the length of the messages or completion.",
                code="context_length_exceeded", param="messages",
            )  # fmt: skip
        return int(want)

    def _finish(self, d: Draw, req: Request, parse_tools: bool) -> Finished:
        """A draw as served: cut at the first stop id or stop string (the ids kept as sampled), its text, reasoning
        and tool calls."""
        ids, cut_text = list(d.ids), None
        stopped = d.stopped
        extra = set(req.stop_token_ids)
        k = next((i + 1 for i, t in enumerate(ids) if t in extra), None)
        if k is not None:
            ids, stopped = ids[:k], True
        if req.stop:
            hit = _stop_cut(self.tokenizer, ids, req.stop)
            if hit is not None:
                (k, cut_text), stopped = hit, True
                ids = ids[:k]
        lps, vers = d.logprobs[: len(ids)], d.versions[: len(ids)]
        top = d.top[: len(ids)] if d.top is not None else None
        reason = "stop" if stopped else "length"
        if parse_tools:
            parsed = self.tool_format.parse(ids, self.eos_ids | extra)
            self.count("tool_parse_errors", parsed.malformed)
            self.count("tool_calls", len(parsed.tool_calls))
            return Finished(ids, lps, vers, "tool_calls" if parsed.tool_calls else reason, parsed.content,
                            parsed.reasoning, parsed.tool_calls, top)  # fmt: skip
        if cut_text is None:
            cut_text = self.tokenizer.decode([t for t in ids if t not in self.eos_ids | extra],
                                             skip_special_tokens=True)  # fmt: skip
        return Finished(ids, lps, vers, reason, cut_text, top=top)

    def _render(
        self, tools_key: str | None, kind: Any, msgs: list[dict[str, Any]], fn: Callable[[], Any]
    ) -> list[int]:
        """The ids `fn` renders for `msgs` (a prompt, or an observation after a turn that ended with EOS or not:
        `kind`), from a cache keyed by the tool set, `kind` and the messages' exact JSON: what a chat template reads
        of them, so a different message (a rewritten history, another tool-call id) is a different key. The n
        episodes of one problem share their first prompt; a harness's tool answers repeat."""
        key = (tools_key, kind, json.dumps(msgs, ensure_ascii=False))  # key order as sent (templates print it)
        with self._lock:
            hit = self._renders.get(key)
            if hit is not None:
                self._renders.move_to_end(key)
                self._counts["render_hits"] += 1
                return list(hit)
        ids = [int(t) for t in self._encode(fn)]
        with self._lock:
            self._renders[key] = tuple(ids)
            if len(self._renders) > RENDER_CACHE:
                self._renders.popitem(last=False)
        return ids

    def _encode(self, fn: Callable[[], Any]) -> Any:
        """`fn()` (a render: it encodes) with the tokenizer to itself, a template's refusal as a 400."""
        with self._tok:
            return _rendered(fn)

    def _renderer(self, tools: list[dict[str, Any]] | None, key: str | None) -> Renderer:
        """The renderer of one tool set, cached (the 64 most recent sets)."""
        with self._lock:
            if key not in self._renderers:
                if len(self._renderers) >= 64:
                    self._renderers.pop(next(iter(self._renderers)))
                self._renderers[key] = self._encode(
                    lambda: Renderer(self.tokenizer, None, max_obs_tokens=self.max_model_len, tools=tools)
                )
            return self._renderers[key]

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise BadRequest("'prompt' must be a string, a list of token ids, or a list of either", param="prompt")
        out = []
        for p in prompt:
            if isinstance(p, str) and p:
                out.append(self._encode(lambda p=p: list(self.tokenizer.encode(p))))
            elif isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
                out.append(self._check_ids(p, "prompt"))
            else:
                raise BadRequest("'prompt': each prompt is a non-empty string or list of token ids", param="prompt")
        return out

    def _check_ids(self, ids: list[int], param: str) -> list[int]:
        vocab = len(self.tokenizer)
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise BadRequest(f"'{param}': token id {bad} is outside the vocabulary [0, {vocab})", param=param)
        return list(ids)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; P3OError (one line) when the port is in use or the host unknown."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it a response's body waits for the ACK of its headers (Nagle against
    # the client's delayed ACK), ~40 ms a call measured on a hello-world route
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise P3OError(f"serve: port {port} on {host} is already in use (choose another with --port)") from err
        raise P3OError(f"serve: cannot listen on {host}:{port}: {err.strerror or err}") from err
    sock.setblocking(False)
    return sock


def _model_len(engine: Any, tokenizer: Any) -> int:
    """The model's context length: ``max_position_embeddings`` of the engine's model (vLLM: its model config's
    ``max_model_len``), else the tokenizer's ``model_max_length``."""
    cfg = getattr(getattr(engine, "model", None), "config", None)
    vllm = getattr(getattr(getattr(engine, "llm", None), "llm_engine", None), "model_config", None)  # VLLMEngine
    n = getattr(cfg, "max_position_embeddings", None) or getattr(vllm, "max_model_len", None)
    n = n or getattr(engine, "max_model_len", None)
    n = n or getattr(tokenizer, "model_max_length", None)
    if not isinstance(n, int) or n <= 0 or n > 10**8:
        raise P3OError("serve: the model's context length is unknown; give max_model_len (--max_model_len)")
    return n


def _rendered(fn: Callable[[], Any]) -> Any:
    """`fn()`, a chat template's refusal (a Jinja error, a template that raises) as a 400 naming the messages."""
    try:
        return fn()
    except BadRequest:
        raise
    except Exception as err:
        raise BadRequest(f"'messages': the chat template cannot render them ({type(err).__name__}: {err})",
                         param="messages") from err  # fmt: skip


def _refuse_unsupported(body: dict) -> None:
    for key, neutral in UNSUPPORTED.items():
        if body.get(key) not in (None, neutral) and body.get(key) != {}:
            raise BadRequest(f"'{key}' is not supported: the recorded log-probs would not be those of the "
                             "distribution sampled from", param=key)  # fmt: skip


def _stop_cut(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """The first k such that ids[:k] decode to a text holding a stop string, and that text before the stop; None
    when no stop string occurs."""
    if not any(s in tokenizer.decode(ids, skip_special_tokens=True) for s in stops):
        return None
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return k, text[: min(hits)]
    return None


def _assistant(f: Finished) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": f.text}
    if f.tool_calls:
        msg["tool_calls"] = f.tool_calls
    return msg


def _choice(f: Finished, d: Draw, eos_ids: set[int], message: tuple | None) -> Choice:
    return Choice(f.ids, f.logprobs, f.versions, bool(f.ids) and f.ids[-1] in eos_ids, f.finish_reason, message,
                  d.kept[: len(f.ids)] if d.kept is not None else None)  # fmt: skip
