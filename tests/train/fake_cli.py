"""`p3o train` (the real command line: options, --resume, config.yaml, history) with the fakes' model and task, for
tests that run it in a subprocess (SIGKILL, file-size limits):

    python tests/train/fake_cli.py [--fsize-after N:BYTES] -- --run_dir RUN --steps 6 ...

``--fsize-after N:BYTES`` limits every file this process writes to BYTES (RLIMIT_FSIZE, as a disk that fills)
from the N-th checkpoint save on (1-based), so that save fails part-way.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from train_fakes import fake_components


def main(argv: list[str]) -> int:
    import p3o.train.checkpoint as ckpt_mod
    import p3o.train.loop as loop_mod
    from p3o.cli import main as p3o_main

    torch.set_num_threads(1)
    sep = argv.index("--")
    opts, args = argv[:sep], argv[sep + 1 :]
    if opts[:1] == ["--fsize-after"]:
        nth, _, limit = opts[1].partition(":")
        real = ckpt_mod.save_checkpoint
        calls = {"n": 0}

        def limited(*a: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == int(nth):
                resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
            return real(*a, **kw)

        ckpt_mod.save_checkpoint = limited
    loop_mod.build_components = lambda cfg: fake_components(cfg.seed)
    return p3o_main(["train", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
