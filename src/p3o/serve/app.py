"""The HTTP routes (FastAPI on uvicorn), each at ``/v1/...`` and at ``/episodes/<id>/v1/...`` (the episode's key):

    GET  /v1/models                   the served model, with max_model_len and the policy version
    POST /v1/chat/completions         messages (+ tools) in; message, tool_calls, token ids, log-probs, versions out
                                      (``stream: true``: server-sent events, the extension fields in the last chunks)
    POST /v1/completions              a prompt (text or ids) in
    POST /inference/v1/generate       vLLM's token-in-token-out route (``token_ids`` + ``sampling_params``)

Every route requires ``Authorization: Bearer <key>``: without it the answer is 401 and nothing of the
request is read or recorded. A keyless ``/v1`` call is recorded under the episode an ``X-Episode-Id`` (or verifiers'
``X-Session-ID``) header names, else not at all. Errors are OpenAI's JSON: ``{"error": {"message", "type", "param",
"code"}}`` with 400 (a bad request, an overlong prompt, an unknown tool format), 401, 404 (another model) or 500.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from p3o.serve.protocol import chat_chunks
from p3o.serve.tools import BadRequest

__all__ = ["EPISODE_HEADERS", "build_app", "check_episode"]

EPISODE_HEADERS = ("x-episode-id", "x-session-id")
_EPISODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 500: "InternalServerError"}


def check_episode(episode_id: str) -> str:
    """An episode key as given, or BadRequest: 1-128 characters of letters, digits and ``_ . : -``."""
    if not isinstance(episode_id, str) or not _EPISODE_RE.fullmatch(episode_id):
        raise BadRequest(f"episode id {episode_id!r}: 1-128 letters, digits, '_', '.', ':' or '-'", param="episode")
    return episode_id


def error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> JSONResponse:
    """OpenAI's error body."""
    body = {"error": {"message": message, "type": _TYPES.get(status, "APIError"), "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def build_app(server: Any) -> FastAPI:
    """The routes of `server` (a `p3o.serve.server.EndpointServer`)."""
    app = FastAPI(title="p3o serve", docs_url=None, redoc_url=None, openapi_url=None)
    key = f"Bearer {server.api_key}".encode()

    app.add_middleware(_BearerKey, key=key, server=server)

    async def _run(kind: str, request: Request, episode: str | None) -> Response:
        try:
            if episode is not None:
                check_episode(episode)
            else:
                episode = next((request.headers[h] for h in EPISODE_HEADERS if request.headers.get(h)), None)
                episode = check_episode(episode) if episode is not None else None
            if kind == "models":
                return JSONResponse(server.models())
            try:
                body = await request.json()
            except ValueError as err:
                raise BadRequest(f"the request body is not JSON ({err})") from err
            if kind == "chat":
                answer = await server.chat(body, episode)
                server.count("ok")
                return _stream(answer) if isinstance(body, dict) and body.get("stream") else JSONResponse(answer)
            answer = await (server.completions if kind == "completions" else server.generate)(body, episode)
            server.count("ok")
            return JSONResponse(answer)
        except BadRequest as err:
            if err.status == 400:
                server.count("bad_request")
            return error(err.status, str(err), code=err.code, param=err.param)
        except Exception as err:  # the engine's failure: one call answered 500, counted, the server goes on
            server.count("server_errors")
            return error(500, f"{type(err).__name__}: {err}", code="internal_error")

    for prefix in ("", "/episodes/{episode}"):
        for kind, method, path in (("models", "GET", "/v1/models"), ("chat", "POST", "/v1/chat/completions"),
                                   ("completions", "POST", "/v1/completions"),
                                   ("generate", "POST", "/inference/v1/generate")):  # fmt: skip
            # plain Starlette routes (a Request in, a Response out): no dependency solving or response encoding
            # per request; the answers are dicts of JSON types, written by JSONResponse as they are
            app.add_route(prefix + path, _endpoint(_run, kind), methods=[method])
    return app


class _BearerKey:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <key>`` is answered 401 before anything of
    it is read (a plain ASGI layer: FastAPI's ``@app.middleware`` costs a task per request)."""

    def __init__(self, app: Any, *, key: bytes, server: Any) -> None:
        self.app, self.key, self.server = app, key, server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.server.count("requests")
        given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        if secrets.compare_digest(given, self.key):
            await self.app(scope, receive, send)
            return
        self.server.count("unauthorized")
        answer = error(401, "a valid 'Authorization: Bearer <key>' header is required", code="invalid_api_key")
        await answer(scope, receive, send)


def _endpoint(run: Any, kind: str) -> Any:
    async def route(request: Request) -> Response:
        return await run(kind, request, request.path_params.get("episode"))

    return route


def _stream(answer: dict[str, Any]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        for chunk in chat_chunks(answer):
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
