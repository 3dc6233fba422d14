"""The `p3o` command: `p3o train | eval | compare | plot | sft | mismatch | doctor | convert-smollm2`.

Each sub-command lives in its own module as `main(argv: list[str]) -> int`; this file only dispatches, in one hop,
importing the module lazily so `p3o --help` stays fast. `train` is also handed the Ray workers' batch source
(`p3o.cluster.RaySource`), because train/ never imports the floor above it.

    p3o train --objective.name grpo --objective.clip_eps 0.4

`p3o` alone prints the command list and exits with status 2 (it names no command; `p3o --help` exits 0).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

from p3o.errors import P3OError

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("p3o.train.cli", "train a policy (no arguments: the embedded default, P3O on the built-in task)"),
    "eval": ("p3o.eval.cli", "pass@k of a checkpoint on a task"),
    "compare": ("p3o.experiments.grid.compare", "run a grid of objectives × regimes × seeds and write a report"),
    "probe": (
        "p3o.experiments.probe.cli",
        "gradient probe: each objective's stale-batch gradient vs the on-policy one",
    ),
    "synthetic": ("p3o.experiments.synthetic.cli", "paired multi-seed runs on a tabular toy policy (exact J)"),
    "plot": ("p3o.metrics.plot", "draw reward / ESS / lag curves of a run directory to PNG"),
    "sft": ("p3o.train.sft", "supervised warm start of the built-in tiny model"),
    "mismatch": ("p3o.eval.mismatch", "how far a rollout engine's log-probs are from the fp32 trainer's"),
    "doctor": ("p3o.metrics.doctor", "off-policy findings from a run's metrics (exit 0 healthy, 1 finding)"),
    "convert-smollm2": ("p3o.models.smollm2", "convert the SmolLM2-135M-Instruct GGUF to a safetensors checkpoint"),
}


def _usage() -> str:
    lines = ["usage: p3o <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`p3o <command> --help` lists a command's options; `p3o train` alone runs the default job."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `p3o <command> ...` to the command's module (no command: print the command list, exit 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        print(f"p3o: unknown command '{name}'{hint}; known: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        if name == "train":  # the one command that needs the floor above train/: the Ray workers' batch source
            from p3o.cluster import RaySource  # heavy: torch start-up, only for `p3o train`

            return int(module.main(rest, remote_source=RaySource) or 0)
        return int(module.main(rest) or 0)
    except P3OError as err:
        print(f"p3o {name}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `p3o train --help | head`: the reader left early; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
