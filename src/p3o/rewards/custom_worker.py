"""The worker process of a user verifier `module:function`: one JSON request per line in, one reply per line out.

Run by `p3o.rewards.custom.CustomVerifier` as `python -m p3o.rewards.custom_worker SPEC SYS_PATH_JSON`; the parent
kills it when a call overruns `task.reward_timeout_s`. The function is imported before the ready line, so its
import time is never charged to a call. Anything the function prints goes to stderr, not into the protocol.

    {"completion": "... #### 7", "answer": "7"}  ->  {"ok": true, "value": 1.0}
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from p3o.rewards.custom import load_function
from p3o.rewards.mv_worker import _die_with_parent, serve


def main(argv: list[str]) -> int:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "w")  # the protocol channel; fd 1 itself now points at stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = argv[0]
    paths = json.loads(argv[1]) if len(argv) > 1 else []
    sys.path[:0] = [p for p in paths if p not in sys.path]
    load_error = None
    fn = None
    try:
        fn = load_function(spec)
    except BaseException as err:  # reported on every request (the parent already imported it once, so rare)
        load_error = f"cannot load {spec}: {type(err).__name__}: {str(err)[:200]}"

    def handle(req: dict[str, Any]) -> float:
        if fn is None:
            raise RuntimeError(load_error)
        value = fn(req["completion"], req["answer"])
        if value is None or isinstance(value, str | bytes):
            raise TypeError(f"returned {value!r}; expected a float")
        number = float(value)  # numpy / torch scalars and bools convert
        if not math.isfinite(number):
            raise TypeError(f"returned {value!r}; expected a finite float")
        return number

    return serve(handle, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
