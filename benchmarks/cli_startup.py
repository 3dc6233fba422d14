"""How long the `p3o` command takes to answer what needs no model: help, version, an option error.

    .venv/bin/python benchmarks/cli_startup.py                 # every case, 3 fresh processes each (median)
    .venv/bin/python benchmarks/cli_startup.py --repeats 5 --json out.json
    .venv/bin/python benchmarks/cli_startup.py --src /tmp/before/src   # another tree's package (git worktree)

Each case runs `python -m p3o ...` (the installed `p3o` script does the same) in a fresh process from this
interpreter and reports the median wall time, the median CPU time (user + system: what a busy machine's load does
not inflate as much), the exit status, and whether torch or transformers got imported
(`-X importtime` is not used: a sitecustomize line checks `sys.modules` at exit). The target (issue 47): every case
≤ 1 s, torch and transformers never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

# `p3o --help`, `--version`, then every command's `--help` and an option error of each (for train: a misspelt key, and
# the objective keywords' errors: one the objective does not take, a misspelt one, a value of the wrong type)
CASES: list[list[str]] = [
    ["--help"],
    ["--version"],
    ["train", "--help"],
    ["train", "--step", "3"],
    ["train", "--optim.lrr", "1e-3"],
    ["train", "--objective.name", "p3o", "--objective.clip_eps", "0.2"],
    ["train", "--objective.name", "p3o", "--objective.clip_epz", "0.2"],
    ["train", "--objective.name", "grpo", "--objective.clip_eps", "x"],
    ["eval", "--help"],
    ["eval", "--n_samples", "x"],
    ["compare", "--help"],
    ["compare", "study.yaml", "--jobz", "2"],
    ["probe", "--help"],
    ["probe", "--pointz", "3"],
    ["synthetic", "--help"],
    ["synthetic", "--seedz", "3"],
    ["plot", "--help"],
    ["plot", "--windoww", "3"],
    ["sft", "--help"],
    ["sft", "--stepz", "3"],
    ["mismatch", "--help"],
    ["mismatch", "--top-p", "2"],
    ["doctor", "--help"],
    ["doctor", "--windoww", "3"],
    ["convert-smollm2", "--help"],
    ["convert-smollm2", "--forse"],
    ["docs"],
    ["examples"],
]

# run the command, then say which heavy modules it imported (on stderr's last line)
_PROBE = (
    "import sys, runpy\n"
    "sys.argv = ['p3o', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('p3o', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "else:\n"
    "    code = 0\n"
    "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
    "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    "sys.exit(code if isinstance(code, int) else 1)\n"
)


def measure(args: list[str], repeats: int, src: str | None = None) -> dict[str, object]:
    """Median wall seconds of `p3o ARGS` over `repeats` fresh processes, its exit status and heavy imports (`src`:
    import p3o from that source folder instead of the installed one)."""
    times, cpus, rc, heavy = [], [], None, ""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    for _ in range(repeats):
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        rc = proc.returncode
        last = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
        heavy = last[-1][len("HEAVY=") :] if last else "?"
    return {
        "command": "p3o " + " ".join(args),
        "median_s": statistics.median(times),
        "cpu_s": statistics.median(cpus),
        "rc": rc,
        "heavy": heavy,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--src", default=None, help="import p3o from this source folder (e.g. an older commit's src/)")
    args = ap.parse_args()
    results = [measure(case, args.repeats, args.src) for case in CASES]
    print(f"| command | wall s (median of {args.repeats}) | CPU s | exit | torch / transformers imported |")
    print("|---|---:|---:|---:|---|")
    for r in results:
        print(f"| `{r['command']}` | {r['median_s']:.2f} | {r['cpu_s']:.2f} | {r['rc']} | {r['heavy'] or 'no'} |")
    worst = max(float(r["median_s"]) for r in results)  # type: ignore[arg-type]
    print(f"\nslowest: {worst:.2f} s (target ≤ 1 s); load average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
