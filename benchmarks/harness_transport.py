"""CPU per request of the ``openai`` SDK's async client on httpx's own transport vs aiohttp's (``httpx-aiohttp``,
the SDK's ``DefaultAioHttpClient``), side by side in one run, ratio printed: what a harness's client costs p3o's
harness processes (`p3o.envs.harness_client.EpisodeLoop` uses aiohttp's where it is installed).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/harness_transport.py              # 32 episodes × 10 calls, 3 rounds

A local server (Starlette + uvicorn with httptools, in a process of its own, as p3o's endpoint is) answers every
``/episodes/<id>/v1/chat/completions`` with one fixed chat completion the size of the endpoint's (24 sampled ids,
150 prompt ids, versions). `--episodes` concurrent episodes, each its own ``openai.AsyncOpenAI`` on one shared
client (as `EpisodeLoop` hands them), send `--calls` requests each, their history growing as a harness's does. The
transports alternate, `--rounds` times after one warm-up round each; per round the process CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time

BODY = {
    "id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": list(range(24)),
                 "message": {"role": "assistant", "content": "The product is 42. #### 42"}}],
    "usage": {"prompt_tokens": 150, "completion_tokens": 24, "total_tokens": 174},
    "prompt_token_ids": list(range(150)), "p3o": {"versions": [0] * 24, "episode": "e"},
}  # fmt: skip


def serve(port: int) -> None:
    """The stand-in endpoint (run as ``harness_transport.py --serve PORT``)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    body = json.dumps(BODY).encode()

    async def chat(request) -> Response:
        await request.body()
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/episodes/{episode}/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", http="httptools")


def client(kind: str, n: int) -> object:
    """The shared async client of one transport: httpx's own pool, or aiohttp's."""
    import httpx

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=2.0)
    if kind == "aiohttp":
        from httpx_aiohttp import HttpxAiohttpClient

        return HttpxAiohttpClient(limits=limits, timeout=60.0, verify=ssl.create_default_context())
    return httpx.AsyncClient(limits=limits, timeout=60.0, verify=ssl.create_default_context())


async def round_cpu(kind: str, port: int, episodes: int, calls: int) -> float:
    """Process CPU milliseconds per request of one round of `episodes` × `calls` requests on transport `kind`."""
    import openai

    http = client(kind, episodes)

    async def episode(i: int) -> None:
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/episodes/e{i}/v1", api_key="k", http_client=http,
                               max_retries=0)  # fmt: skip
        messages = [{"role": "user", "content": "What is 47 * 6?"}]
        for _ in range(calls):
            out = await c.chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=1.0)
            messages += [{"role": "assistant", "content": out.choices[0].message.content},
                         {"role": "user", "content": "282"}]  # fmt: skip

    c0 = time.process_time()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    ms = 1e3 * (time.process_time() - c0) / (episodes * calls)
    await http.aclose()
    return ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        for _ in range(100):  # wait for it to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"# load average at start: {os.getloadavg()}; {args.episodes} episodes × {args.calls} calls a round")
        per: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
        for r in range(args.rounds + 1):
            for kind in per:
                ms = asyncio.run(round_cpu(kind, port, args.episodes, args.calls))
                if r > 0:  # the first round of each warms up (imports, pools)
                    per[kind].append(ms)
        for kind, v in per.items():
            each = " ".join(f"{x:.2f}" for x in v)
            print(f"{kind:<8} CPU per request: {each} ms; median {statistics.median(v):.2f}")
        ratio = statistics.median(per["httpx"]) / statistics.median(per["aiohttp"])
        print(f"httpx ÷ aiohttp CPU per request (medians): {ratio:.2f}")
    finally:
        server.terminate()
        server.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
