"""Benchmark of the command line's answers before any work: `--help`, `--cfg job` and mistakes.

Each command runs `--runs` times as a fresh `python -m pipeline ...` process (what a user waits
for), taken in turn; the table shows the best and the median wall time and the median CPU time (user
+ system, of the process and its children). The anchor is the interpreter alone (`python -c pass`),
measured in the same run: what the pipeline adds is imports, the language table, composing the
config and checking it. With `--baseline PATH` (another checkout of the project, e.g. the main
branch) every command also runs there, and the ratio rows divide its times by this checkout's. The
load average before and after is printed: on a shared machine it decides the wall times.

    python bench/cli.py                          # this checkout, 5 runs each
    python bench/cli.py --baseline ../main --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# name -> the arguments after `python -m pipeline`; {base} is a folder with a BLOOM config.json.
COMMANDS = {
    "--help": ["--help"],
    "--cfg job": ["--cfg", "job", "stage=clean", "lang=nob"],
    "--cfg job, model.base": ["--cfg", "job", "stage=warmup", "lang=nob", "model.base={base}"],
    "unknown key": ["stage=clean", "lang=nob", "clean.heldout_fracton=0.1"],
    "wrong type": ["stage=clean", "lang=nob", "tokenizer.vocab_size=abc"],
    "unknown language": ["stage=clean", "lang=norwegian"],
}


def timed(argv: list[str], cwd: Path, pythonpath: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit status) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result.returncode


def measure(checkout: Path, base: Path, cwd: Path, runs: int) -> dict[str, dict]:
    """Per command: best and median wall, median CPU, exit status; `python -c pass` first, as the
    anchor."""
    commands = {"python -c pass (anchor)": [sys.executable, "-c", "pass"]}
    commands.update(
        {
            name: [sys.executable, "-m", "pipeline", *(a.format(base=base) for a in args)]
            for name, args in COMMANDS.items()
        }
    )
    samples = {name: [] for name in commands}
    for _ in range(runs):  # in turn, so that a change of load affects every command alike
        for name, argv in commands.items():
            samples[name].append(timed(argv, cwd, checkout))
    return {
        name: {
            "best": min(w for w, _, _ in runs_),
            "median": statistics.median(w for w, _, _ in runs_),
            "cpu": statistics.median(c for _, c, _ in runs_),
            "status": runs_[-1][2],
        }
        for name, runs_ in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--baseline", type=Path, help="another checkout of the project to compare with"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cwd, base = Path(tmp), Path(tmp) / "bloom"
        base.mkdir()
        (base / "config.json").write_text(
            json.dumps(
                {
                    "architectures": ["BloomForCausalLM"],
                    "vocab_size": 512,
                    "hidden_size": 64,
                    "n_layer": 2,
                    "n_head": 4,
                }
            ),
            encoding="utf-8",
        )
        load_before = os.getloadavg()[0]
        ours = measure(REPO, base, cwd, args.runs)
        theirs = measure(args.baseline.resolve(), base, cwd, args.runs) if args.baseline else None
        load_after = os.getloadavg()[0]

    print(
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after; "
        f"{args.runs} runs each; times in seconds"
    )
    print(
        "| command | exit | best wall | median wall | median CPU |"
        + (" baseline best wall | baseline median CPU | wall ratio | CPU ratio |" if theirs else "")
    )
    print("|---|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if theirs else ""))
    for name, row in ours.items():
        line = f"| {name} | {row['status']} | {row['best']:.2f} | {row['median']:.2f} | {row['cpu']:.2f} |"
        if theirs:
            other = theirs[name]
            line += (
                f" {other['best']:.2f} | {other['cpu']:.2f} | {other['best'] / row['best']:.1f} | "
                f"{other['cpu'] / row['cpu']:.1f} |"
            )
        print(line)
    anchor = ours["python -c pass (anchor)"]
    print(
        f"\nratio to the anchor (python -c pass, best wall {anchor['best']:.2f} s): "
        + ", ".join(
            f"{name} {row['best'] / anchor['best']:.1f}"
            for name, row in ours.items()
            if "anchor" not in name
        )
    )


if __name__ == "__main__":
    main()
