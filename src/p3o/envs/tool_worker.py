"""The tool worker process: runs tool calls, one JSON request per line in, one reply per line out.

Run by `p3o.envs.tools.ToolRunner` as ``python -m p3o.envs.tool_worker SPECS_JSON SYS_PATH_JSON MEMORY_GIB_JSON``;
the parent kills it when a call overruns ``agent.tool_timeout_s``. The tools are imported before the ready line, so
their import time is never charged to a call; a result longer than ``max_chars`` is cut here (a flood never crosses
the pipe); the address space is capped (``memory_gib``). Anything a tool prints goes to stderr, not into the
protocol.

    {"spec": "p3o.envs.tools:calculator", "arguments": {"expression": "2+3"}, "latency_s": 0, "max_chars": 2000}
      ->  {"ok": true, "value": {"output": "5", "cut": 0}}
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from p3o.envs.tools import Tool, cut_text, resolve_spec
from p3o.rewards.mv_worker import _die_with_parent, _limit_memory, serve


def main(argv: list[str]) -> int:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "w")  # the protocol channel; fd 1 itself now points at stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    specs = json.loads(argv[0]) if argv else []
    paths = json.loads(argv[1]) if len(argv) > 1 else []
    memory_gib = json.loads(argv[2]) if len(argv) > 2 else None
    if memory_gib:
        _limit_memory(float(memory_gib))
    sys.path[:0] = [p for p in paths if p not in sys.path]
    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}

    def load(spec: str) -> Any:
        if spec not in fns and spec not in errors:
            try:
                obj = resolve_spec(spec)
                fns[spec] = obj.fn if isinstance(obj, Tool) else obj
            except BaseException as err:
                errors[spec] = f"{type(err).__name__}: {str(err)[:200]}"
        if spec in errors:
            raise RuntimeError(f"cannot load tool {spec}: {errors[spec]}")
        return fns[spec]

    for spec in specs:
        with contextlib.suppress(RuntimeError):  # reported on each call of that tool
            load(spec)

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("ping"):
            return {"output": "", "cut": 0}
        fn = load(req["spec"])
        if req.get("latency_s"):
            time.sleep(float(req["latency_s"]))
        output = fn(req.get("arguments") or {})
        text, cut = cut_text(str(output), int(req.get("max_chars", 2000)))
        return {"output": text, "cut": cut}

    return serve(handle, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
