"""Ship the built-in bases: rebuild them from the current sources and copy them into ``p3o/models/shipped/``.

A maintainer's command (the package's shipped bases are what every user loads, `p3o.models.bases`):

    python -m p3o.models.ship --check            # exit 1, naming what changed, when the current sources or recipes
                                                 # no longer are the ones a shipped base was built from
    python -m p3o.models.ship                    # build every drifted base into the cache (once per key), ship it
    python -m p3o.models.ship tiny-agent --force # rebuild one even when it is current or the cache holds it
    python -m p3o.models.ship tiny-chat          # the endpoint testbed's base (p3o.models.chat)

Each base is built by the code that builds it on first use (`p3o.models.warmstart.ensure_base`,
`p3o.models.agent.ensure_agent_base`, `p3o.models.chat.ensure_chat_base`: the cache and its keys), then copied whole
with a fresh ``manifest.json``. The command says, per base, whether the weights changed: a source change that does not
change what is computed rebuilds the same bytes on the same CPU kind (the warm start's kernels differ between AVX2-only
and AVX-512 CPUs; ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2`` forces AVX2 code
paths on an AVX-512 machine, but on an Intel Xeon with AVX-512 that did not reproduce the main base the AVX2-only AMD
EPYC built: ``tiny`` rebuilt there as tiny@54fa4b42a3f8, not tiny@6550aedbf4ee, with the same sources, the same thread
count; 20 warm-start steps under transformers 5.24 and 5.25 gave the same bytes there). So a base whose sources and
recipe are the shipped ones ("current") is kept without a rebuild, and with ``--force`` a rebuild of it that has other
weights is not shipped unless ``--replace`` says so. New weights mean new figures: docs/main-job.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from p3o.models.agent import AGENT_RECIPE, AGENT_SOURCES, ensure_agent_base
from p3o.models.bases import (
    MANIFEST,
    SHIPPED,
    SHIPPED_ROOT,
    WEIGHTS,
    base_id,
    file_sha256,
    manifest,
    sources_fingerprint,
)
from p3o.models.chat import CHAT_RECIPE, CHAT_SOURCES, ensure_chat_base, init_tag, shipped_main
from p3o.models.tiny import BASE_SOURCES, LIBRARIES, TESTBED_SOURCES, TESTBEDS, code_version
from p3o.models.warmstart import ensure_base, sft_recipe, testbed_recipe

__all__ = ["build", "cpu_name", "drift", "fingerprints", "main", "note_shipped", "recipe", "ship", "sources"]


def sources(name: str) -> tuple[str, ...]:
    """The source specs a shipped base is built from (what its cache key fingerprints)."""
    return {
        "tiny": BASE_SOURCES,
        "tiny-pad": (*BASE_SOURCES, *TESTBED_SOURCES),
        "tiny-agent": (*BASE_SOURCES, *AGENT_SOURCES),
        "tiny-chat": (*BASE_SOURCES, *CHAT_SOURCES),
    }[name]


def recipe(name: str) -> dict[str, Any]:
    """The recipe a shipped base is built with today (the agent's: `AGENT_RECIPE`, the chat base's: `CHAT_RECIPE`;
    both start from the main base)."""
    if name == "tiny-agent":
        return dict(AGENT_RECIPE)
    if name == "tiny-chat":
        return dict(CHAT_RECIPE)
    return sft_recipe(testbed_recipe(2 if name == "tiny" else TESTBEDS["pad"]["difficulty"]))


def build(name: str, cache_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """The cache entry of `name` for the current code (built when missing, or again with `force`)."""
    if name == "tiny":
        return ensure_base(cache_dir=cache_dir, force=force)
    if name == "tiny-agent":
        return ensure_agent_base(cache_dir, force=force)
    if name == "tiny-chat":
        return ensure_chat_base(cache_dir, force=force)
    bed = TESTBEDS[name.removeprefix("tiny-")]
    return ensure_base(bed["size"], cache_dir, task=bed["task"], difficulty=bed["difficulty"], force=force)


def _libraries() -> dict[str, str]:
    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "absent"
    return out


def cpu_name() -> str:
    """This machine's CPU, and whether it has AVX-512 (the kind whose kernels build another base) or AVX2 only."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    kind = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    return f"{model} ({kind}{f', ATEN_CPU_CAPABILITY={forced}' if forced else ''})"


def fingerprints(name: str) -> dict[str, Any]:
    """The current code's ``code_version`` and ``sources`` entries of a manifest (read from the files now)."""
    specs = sources(name)
    code_version.cache_clear()
    return {
        "code_version": code_version(specs),
        "sources": {"specs": list(specs), "fingerprint": sources_fingerprint(specs)},
    }


def ship(
    name: str, built: str | Path, root: str | Path | None = None, code: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Copy the cache entry `built` whole into ``<root>/<name>/`` (default root: the package's shipped/) with its
    manifest; returns the manifest. `code`: the `fingerprints` taken when the build started (default: now). The old
    directory is replaced only once the new one is complete."""
    built, root = Path(built), Path(root or SHIPPED_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    files = sorted(p.name for p in built.iterdir() if p.is_file() and not p.name.startswith("."))
    assert WEIGHTS in files and "config.json" in files, f"{built} is not a built base"
    info = {
        "name": name,
        "key": built.name,
        "sha256": file_sha256(built / WEIGHTS),
        **(code or fingerprints(name)),
        "libraries": _libraries(),
        "recipe": recipe(name),
        "built_on": cpu_name(),
        "files": {f: file_sha256(built / f) for f in files if f != WEIGHTS},
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        for f in files:
            shutil.copyfile(built / f, tmp / f)
            os.chmod(tmp / f, 0o644)
        (tmp / MANIFEST).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        target = root / name
        if target.exists():
            old = root / f".{name}.old-{os.getpid()}"
            target.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    note_shipped(built, info)
    return info


def note_shipped(built: str | Path, info: dict[str, Any]) -> None:
    """The cache entry's sft.json now says that it is the shipped base (``stats.sha256``, ``stats.shipped``): what
    ``p3o sft`` prints when it finds the entry, which the build recorded before the base shipped."""
    path = Path(built) / "sft.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(doc, dict) and isinstance(doc.get("stats"), dict):
        doc["stats"]["sha256"] = info["sha256"]
        doc["stats"]["shipped"] = {"name": info["name"], "shipped": base_id(info), "equal": True}
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


def drift(name: str, root: str | Path | None = None) -> list[str]:
    """What the current code would build differently from the shipped base `name`: its source specs, their
    fingerprint (`p3o.models.bases.sources_fingerprint`), its recipe, the shipped main base a chat base starts from
    (`p3o.models.chat.main_base`), or no shipped base at all; [] when none. (Library versions are left
    out: `p3o.models.ship` reports them, and the shipped base is loaded whatever they are.)"""
    if not (Path(root or SHIPPED_ROOT) / name / MANIFEST).is_file():
        return ["not shipped yet"]
    info = manifest(name, root)
    specs, out = sources(name), []
    if list(specs) != info["sources"]["specs"]:
        out.append(f"its sources are now {', '.join(specs)} (shipped: {', '.join(info['sources']['specs'])})")
    elif sources_fingerprint(specs) != info["sources"]["fingerprint"]:
        out.append(f"the code of {', '.join(specs)} changed since it was built")
    if recipe(name) != info["recipe"]:
        changed = sorted(k for k in {*recipe(name), *info["recipe"]} if recipe(name).get(k) != info["recipe"].get(k))
        out.append(f"its recipe changed ({', '.join(changed)})")
    main = shipped_main() if name == "tiny-chat" else None
    if main is not None and not info["key"].endswith(init_tag(main)):  # it starts from the shipped main base
        out.append("the shipped main base it starts from changed")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p3o.models.ship", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"bases to ship: {', '.join(SHIPPED)} (default: all)")
    parser.add_argument("--check", action="store_true", help="only say which shipped bases drifted (exit 1 if any)")
    parser.add_argument(
        "--force", action="store_true", help="rebuild even a current base, and even when the cache holds its key"
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="ship a rebuild of a current base whose weights differ (built on another CPU kind than the shipped one)",
    )
    parser.add_argument("--cache-dir", default=None, help="the cache to build in (default: $P3O_CACHE, ~/.cache/p3o)")
    parser.add_argument("--root", default=None, help="where to ship (default: the package's shipped/)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SHIPPED]
    if unknown:
        parser.error(f"not a shipped base: {', '.join(unknown)} (shipped: {', '.join(SHIPPED)})")
    names = [n for n in SHIPPED if n in args.names] if args.names else list(SHIPPED)
    if args.check:
        bad = {n: drift(n, args.root) for n in names}
        for n, why in bad.items():
            print(f"{n}: {'; '.join(why) if why else 'current'}")
        return 1 if any(bad.values()) else 0
    for n in names:  # in SHIPPED order: the agent and chat bases start from the main base, built first
        old = None
        if (Path(args.root or SHIPPED_ROOT) / n / MANIFEST).is_file():
            old = base_id(manifest(n, args.root))
        current = old is not None and not drift(n, args.root)
        if current and not args.force:
            print(f"{n}: current ({old}: built from today's sources and recipe): kept (--force rebuilds it)")
            continue
        code = fingerprints(n)
        built = build(n, args.cache_dir, force=args.force)
        if fingerprints(n) != code or f"-c{code['code_version']}" not in built.name:  # an edit landed meanwhile
            print(f"{n}: its sources changed during the build; not shipped (run again)", file=sys.stderr)
            return 1
        rebuilt = f"{n}@{file_sha256(built / WEIGHTS)[:12]}"
        if current and rebuilt != old and not args.replace:  # same code, other kernels: keep the base runs use
            print(
                f"{n}: current, but rebuilt as {rebuilt} on {cpu_name()}, not {old} (another CPU kind than the "
                "one that built it): kept the shipped one (--replace ships the rebuild)"
            )
            continue
        info = ship(n, built, args.root, code)
        new = base_id(info)
        what = "unchanged weights" if new == old else f"NEW weights (was {old}): regenerate the figures"
        print(f"{n}: shipped {new} from {info['key']} on {info['built_on']}: {what}")
    return 0


if __name__ == "__main__":  # pragma: no cover - python -m p3o.models.ship
    sys.exit(main())
