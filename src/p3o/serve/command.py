"""What ``p3o serve`` runs once its options are read (`p3o.serve.cli`): load the policy, build its engine, serve it
until Ctrl-C, print the counters."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import torch

from p3o.models import load_policy
from p3o.rollout.factory import make_engine
from p3o.rollout.settings import EngineSettings
from p3o.serve.server import EndpointServer, bind, key_prefix

__all__ = ["run"]


def run(args: Any) -> int:
    """Serve ``args.model`` (a `p3o.serve.cli.ServeOptions`) until SIGINT / SIGTERM; 0 when stopped."""
    sock = bind(args.host, args.port)  # a port in use is one line before the model loads
    if args.threads:
        torch.set_num_threads(int(args.threads))
    model, tok = load_policy(args.model, seed=args.seed)
    settings = EngineSettings(engine=args.engine, precision=args.precision, seed=args.seed)
    extra = {"max_model_len": args.max_model_len} if args.engine == "vllm" and args.max_model_len else {}
    engine = make_engine(settings, model, tok, **extra)
    server = EndpointServer(engine, tok, model_name=args.model, api_key=args.api_key, host=args.host,
                            port=args.port, max_model_len=args.max_model_len, tool_format=args.tool_format,
                            window_s=args.window_ms / 1000.0, default_max_tokens=args.default_max_tokens)  # fmt: skip
    server.start(sock)
    path = server.write_info(args.info)
    print(f"p3o serve: {args.model} at {server.base_url} (episodes: {server.url}/episodes/<id>/v1); "
          f"key {key_prefix(server.api_key)} in {path}; tool format {server.tool_format.name}; Ctrl-C stops",
          flush=True)  # fmt: skip
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"p3o serve: warning: bound to {args.host}, not localhost: anyone who reaches it with the key can "
              "send data into a training run", file=sys.stderr, flush=True)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        counts = server.counters()
        shown = ("requests", "ok", "unauthorized", "bad_request", "overlong", "engine_calls", "sampled_tokens")
        print("p3o serve: stopped; " + ", ".join(f"{k} {counts[k]}" for k in shown), file=sys.stderr, flush=True)
    return 0
