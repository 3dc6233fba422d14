"""`p3o train`: the training command with the Ray rollout workers available.

`p3o.train.cli.main` is the whole command; this floor (above train/) only hands it the Ray batch source, so that
`--rollout.workers N` works from the command line while train/ never imports the Ray layer:

    p3o train --rollout.workers 2                  # p3o.cli dispatches `train` here
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`p3o train ARGS`: `p3o.train.cli.main(argv, remote_source=RaySource)`; returns the exit status."""
    from p3o.cluster.source import RaySource
    from p3o.train.cli import main as train_main

    return train_main(argv, remote_source=RaySource)


__all__ = ["main"]
