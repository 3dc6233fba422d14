"""``p3o serve``: a policy behind the OpenAI / vLLM endpoint until Ctrl-C (its options, ``--help`` and option errors
answer before torch loads; the serving itself is `p3o.serve.server`).

    p3o serve --model tiny-agent --port 8000                  # a key is generated and written to serve.json (0600)
    p3o serve --model runs/x/checkpoints/step_40 --api_key K --tool_format qwen3
    curl -H "Authorization: Bearer K" http://127.0.0.1:8000/v1/models
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from p3o.options import config_field as _f
from p3o.options import run_command

__all__ = ["ABOUT", "USAGE", "ServeOptions", "main"]

ABOUT = "serve a policy over OpenAI chat completions and vLLM's generate route, recording every sampled token"
USAGE = "usage: p3o serve --model NAME_OR_PATH [--port P] [--api_key K] [--host H] [--tool_format F] [--key value ...]"


@dataclass
class ServeOptions:
    """Options of ``p3o serve``."""

    model: str = _f("tiny-agent", "a shipped base (tiny, tiny-agent, ...), a checkpoint or Hub-format dir, a Hub id")
    port: int = _f(8000, "TCP port (0: a free one, printed)", ge=0, le=65535)
    host: str = _f("127.0.0.1", "address to bind (localhost by default: whatever reaches it may enter training)")
    api_key: str | None = _f(None, "the bearer key clients must send (null: generated, written to --info)")
    info: str = _f("serve.json", "JSON file (mode 0600) with the URL, the key and the model, for harnesses")
    tool_format: Literal["auto", "qwen3", "llama3", "none"] = _f("auto", "tool-call format (p3o.serve.tools)")
    max_model_len: int | None = _f(None, "context length (null: the model's max_position_embeddings)", ge=1)
    default_max_tokens: int | None = _f(None, "tokens a request without max_tokens may sample (null: the rest of "
                                        "the context, as vLLM)", ge=1)  # fmt: skip
    engine: Literal["hf", "vllm"] = _f("hf", "rollout engine that samples")
    precision: str = _f("fp32", "the engine's precision: fp32 | bf16 | fp16 | int8 | fp8")
    seed: int = _f(0, "the engine's sampling seed (a request's own seed wins)")
    window_ms: float = _f(5.0, "how long the batcher waits for more requests to batch with the first", ge=0)
    threads: int = _f(0, "torch threads (0: leave as is)", ge=0)


def main(argv: Sequence[str] | None = None) -> int:
    """``p3o serve``; serves until interrupted (exit 0), 2 on bad options or a port in use."""
    # p3o.serve.command is heavy (torch, the model libraries, the ASGI stack): imported once the options are valid
    return run_command(argv, ServeOptions, USAGE, ABOUT, "p3o.serve.command:run")


if __name__ == "__main__":
    sys.exit(main())
