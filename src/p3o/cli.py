"""The `p3o` command: `p3o train | eval | compare | plot | sft | mismatch | doctor | convert-smollm2`.

Each sub-command lives in its own module as `main(argv: list[str]) -> int`; this file only dispatches, in one hop,
importing the module lazily so `p3o --help` stays fast. `train` is also handed the Ray workers' batch source
(`p3o.cluster.RaySource`), because train/ never imports the floor above it.

    p3o train --objective.name grpo --objective.clip_eps 0.4

`p3o` alone prints the command list and exits with status 2 (it names no command; `p3o --help` exits 0);
`p3o --version` prints the version. This module imports nothing heavy: `--help`, `--version`, a command's `--help`
and its option errors answer before torch or transformers load (benchmarks/cli_startup.py, docs/benchmarks.md); for
the commands whose option classes live beside torch (`HELP_SNAPSHOT`) it answers them from a packaged snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import importlib.metadata
import io
import json
import os
import sys
import warnings
from importlib.resources import files
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError, P3OError

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
    "mismatch": ("p3o.eval.mismatch_cli", "how far a rollout engine's log-probs are from the fp32 trainer's"),
    "doctor": ("p3o.metrics.doctor", "off-policy findings from a run's metrics (exit 0 healthy, 1 finding)"),
    "serve": ("p3o.serve.cli", "serve a policy over OpenAI chat completions / vLLM generate, recording every token"),
    "convert-smollm2": ("p3o.models.smollm2", "convert the SmolLM2-135M-Instruct GGUF to a safetensors checkpoint"),
    "docs": ("p3o.cli", "print a page of the documentation shipped with the package (p3o docs NAME)"),
    "examples": ("p3o.cli", "write an example's files here: own-task (data + reward of p3o docs tasks), study"),
}


#: Commands whose module imports torch, transformers or scipy at its top: the option class their `main` parses into
#: (module:class), how it parses (`p3o.options.parse_command` or `load_config`), the argument a leading positional
#: fills, and the options `main` takes itself (name -> whether it takes a value). Their option classes live on floors
#: below the commands, beside the code that runs them; so that `p3o <command> --help` and an option error answer
#: before those libraries load, p3o.cli reads both from a snapshot, packaged as p3o/configs/commands-help.json: the
#: `--help` text and the option class's schema (keys, types, defaults, bounds), which it rebuilds as a dataclass and
#: parses the command line into, with the command's own parser. A test keeps the snapshot equal to the commands;
#: regenerate it with `python -m p3o.cli --help-snapshot > src/p3o/configs/commands-help.json`.
HELP_SNAPSHOT: dict[str, tuple[str, str, str | None, dict[str, bool]]] = {
    "compare": ("p3o.experiments.grid.compare:CompareOptions", "load_config", "experiment", {}),
    "probe": ("p3o.experiments.probe.cli:ProbeOptions", "parse_command", None, {}),
    "synthetic": ("p3o.experiments.synthetic.cli:SyntheticOptions", "load_config", None, {}),
    "sft": ("p3o.models.warmstart:SFTConfig", "load_config", None, {"out": True, "force": False}),
    "convert-smollm2": ("p3o.models.smollm2:ConvertOptions", "parse_command", None, {}),
}
HELP_SNAPSHOT_FILE = "commands-help.json"


def command_snapshot(*, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """{command: {"help": its `--help` text, "fields": [[key, type (`p3o.config.type_text`), default, {bound:
    value}], ...] of its option class, "aliases": the class's `cli_aliases`}} for the commands of `HELP_SNAPSHOT`:
    from the packaged snapshot, or (``fresh``, or no snapshot) from the commands themselves (which imports torch)."""
    snap = files("p3o") / "configs" / HELP_SNAPSHOT_FILE
    if not fresh and snap.is_file():
        return dict(json.loads(snap.read_text(encoding="utf-8")))
    from p3o import config, options  # heavy: pydantic and yaml (~0.2 s), not for `p3o --version`

    out: dict[str, dict[str, Any]] = {}
    for name, (target, *_) in HELP_SNAPSHOT.items():
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            importlib.import_module(COMMANDS[name][0]).main(["--help"])
        module, _, cls_name = target.partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        fields = [
            [
                key,
                config.type_text(tp),
                f.default,
                {b: f.metadata[b] for b in ("gt", "ge", "lt", "le") if b in f.metadata},
            ]
            for key, f, tp in options.leaf_fields(cls)
        ]
        out[name] = {"help": text.getvalue(), "fields": fields, "aliases": dict(getattr(cls, "cli_aliases", {}))}
    return out


def snapshot_options(name: str, entry: dict[str, Any]) -> type:
    """The option class of command `name` rebuilt from its snapshot `entry`: the same keys, types, defaults and
    bounds, so the same parser gives the same one-line errors (the class's own `_cross_check` is not in it)."""
    from p3o import config, options  # heavy: pydantic and yaml (~0.2 s), not for `p3o --version`

    spec = [(key, config.parse_type(tp), options.config_field(default, "(snapshot)", **bounds))
            for key, tp, default, bounds in entry["fields"]]  # fmt: skip
    cls = dataclasses.make_dataclass(f"{name.replace('-', '_')}_snapshot_options", spec)
    cls.cli_aliases = dict(entry["aliases"])  # type: ignore[attr-defined]
    return cls


def _snapshot_answer(name: str, argv: list[str]) -> int | None:
    """`p3o <command> --help` and an option error of a `HELP_SNAPSHOT` command, answered from the snapshot (the
    command's own message, e.g. `unknown key 'stepz' (did you mean 'steps'?)`); None: the command itself runs."""
    if name not in HELP_SNAPSHOT or (name == "compare" and argv[:1] == ["--check"]):
        return None
    snap = command_snapshot().get(name)
    if snap is None:
        return None
    if any(a in {"-h", "--help"} for a in argv):
        print(snap["help"], end="")
        return 0
    _, parser, positional, own = HELP_SNAPSHOT[name]
    args, i = [], 0
    while i < len(argv):  # the options `main` takes itself are not the option class's
        key, eq, _ = argv[i].partition("=")
        if key.startswith("--") and key[2:] in own:
            if own[key[2:]] and not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    return None  # the command says what is missing
                i += 1
        else:
            args.append(argv[i])
        i += 1
    if positional and args and not args[0].startswith("--"):
        args = [f"--{positional}", *args]
    from p3o import options  # heavy: pydantic and yaml (~0.2 s), not for `p3o --version`

    try:
        getattr(options, parser)(args, snapshot_options(name, snap))
    except ConfigError as err:
        print(f"p3o {name}: error: {err}", file=sys.stderr)
        return 2
    return None


class _LazyRaySource:
    """`p3o.cluster.RaySource`, imported on first use (torch and Ray start-up), so `p3o train --help` and option
    errors stay fast. The loop calls it (`remote_source(cfg, ...)`) and its `preflight`."""

    @staticmethod
    def _cls() -> Any:
        from p3o.cluster import RaySource  # heavy: torch start-up, only once a run needs rollout workers

        return RaySource

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cls()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls(), name)


def _pages() -> Any:
    """The documentation pages shipped with the package (p3o/pages/*.md: the repository's docs/, package data)."""
    return files("p3o") / "pages"


def docs_main(argv: list[str]) -> int:
    """`p3o docs [NAME]`: print the page docs/NAME.md as shipped with the package (no NAME: the list of pages).

    Messages that name a page (`docs/metrics.md`) can be read this way wherever p3o is installed:
    `p3o docs metrics` (or `p3o docs docs/metrics.md`). A `#section` suffix is accepted and ignored.
    """
    pages = _pages()
    names = sorted(p.name[:-3] for p in pages.iterdir() if p.name.endswith(".md")) if pages.is_dir() else []
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: p3o docs NAME   (print the page docs/NAME.md shipped with the package)\n")
        print("pages: " + ", ".join(names))
        return 0
    if len(argv) > 1:
        print(f"p3o docs: error: one page at a time, got {len(argv)} arguments", file=sys.stderr)
        return 2
    name = argv[0].split("#")[0].removeprefix("docs/").removesuffix(".md")
    if name not in names:
        near = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        print(f"p3o docs: error: no page '{argv[0]}'{hint}; pages: {', '.join(names)}", file=sys.stderr)
        return 2
    print((pages / f"{name}.md").read_text(encoding="utf-8"), end="")
    return 0


#: `p3o examples NAME`: the files it writes (name written -> file in p3o/examples/) and what to run next. Stored
#: under other names where the real one would make the package import or lint them (a .py file).
EXAMPLES: dict[str, tuple[dict[str, str], str]] = {
    "own-task": (
        {"own_task.jsonl": "own_task.jsonl", "own_reward.py": "own_reward.py.txt"},
        "the worked example of `p3o docs tasks` ('Your own data, model and reward') runs from this directory",
    ),
    "study": ({"study.yaml": "study.yaml"}, "p3o compare study.yaml --exploratory (its first line says so)"),
}


def examples_main(argv: list[str]) -> int:
    """`p3o examples [NAME] [--dir DIR]`: write an example's files into DIR (default: here); no NAME lists them.

    A file that exists already is not replaced (one line, exit 2). The files ship with the package, so the docs'
    examples run from an installed wheel as they do from a checkout (where tests/data/ holds the same files).
    """
    args, dest = list(argv), Path(".")
    if "--dir" in args:
        i = args.index("--dir")
        if i + 1 >= len(args):
            print("p3o examples: error: --dir: expected a directory", file=sys.stderr)
            return 2
        dest = Path(args[i + 1])
        del args[i : i + 2]
    if not args or args[0] in {"-h", "--help"}:
        print("usage: p3o examples NAME [--dir DIR]   (write an example's files into DIR, default: here)\n")
        for name, (written, then) in EXAMPLES.items():
            print(f"  {name:<10} {', '.join(written)}: {then}")
        return 0
    name = args[0]
    if name not in EXAMPLES or len(args) > 1:
        near = difflib.get_close_matches(name, EXAMPLES, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        what = f"no example '{name}'{hint}" if name not in EXAMPLES else f"unexpected argument '{args[1]}'"
        print(f"p3o examples: error: {what}; examples: {', '.join(EXAMPLES)}", file=sys.stderr)
        return 2
    written, then = EXAMPLES[name]
    targets = {dest / out: files("p3o") / "examples" / stored for out, stored in written.items()}
    there = [str(t) for t in targets if t.exists()]
    if there:
        print(f"p3o examples: error: {', '.join(there)} exist(s) already; nothing written (--dir DIR elsewhere)",
              file=sys.stderr)  # fmt: skip
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    for target, source in targets.items():
        target.write_bytes(source.read_bytes())
    print(f"p3o examples: wrote {', '.join(str(t) for t in targets)}; {then}")
    return 0


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), without importing the package's heavy modules."""
    try:
        return importlib.metadata.version("p3o")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _usage() -> str:
    lines = [f"usage: p3o <command> [options]   (p3o {_version()})", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`p3o <command> --help` lists a command's options; `p3o train` alone runs the default job."]
    lines += ["A page a message names (docs/NAME.md) is printed by `p3o docs NAME`, wherever p3o is installed."]
    return "\n".join(lines)


#: What `quiet_dependencies` silences: progress bars and advisory messages of the model libraries (environment
#: variables they read at import), and the warnings they raise about their own internals (README "Install",
#: docs/metrics.md "Console output"). P3O_VERBOSE=1 keeps all of it.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights 46/46" bar and the Hub's download bars
    "TRANSFORMERS_VERBOSITY": "error",  # its advisory log lines ("generation flags are not valid", ...)
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
QUIET_WARNINGS = ("transformers", "trl", "accelerate", "peft", "torch", "datasets", "huggingface_hub")


def quiet_dependencies() -> None:
    """Once per `p3o` process, before a command imports the model libraries: their progress bars and advisory
    messages off, and their FutureWarnings / DeprecationWarnings about their own internals filtered (p3o's own
    warnings, a changed default or a deprecated p3o option, still show). A variable the user set is kept; with
    P3O_VERBOSE=1 nothing is changed."""
    if os.environ.get("P3O_VERBOSE", "") not in ("", "0"):
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for module in QUIET_WARNINGS:
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=rf"{module}(\.|$)")


def main(argv: list[str] | None = None) -> int:
    """Dispatch `p3o <command> ...` to the command's module (no command: print the command list, exit 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        print(f"p3o {_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        print(f"p3o: unknown command '{name}'{hint}; known: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    quiet_dependencies()
    if name == "docs":
        return docs_main(rest)
    if name == "examples":
        return examples_main(rest)
    try:
        answer = _snapshot_answer(name, rest)
        if answer is not None:
            return answer
        module = importlib.import_module(COMMANDS[name][0])
        if name == "train":  # the one command that needs the floor above train/: the Ray workers' batch source
            return int(module.main(rest, remote_source=_LazyRaySource()) or 0)
        return int(module.main(rest) or 0)
    except P3OError as err:
        print(f"p3o {name}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `p3o train --help | head`: the reader left early; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--help-snapshot"]:
        print(json.dumps(command_snapshot(fresh=True), indent=1, ensure_ascii=False))
        sys.exit(0)
    sys.exit(main())
