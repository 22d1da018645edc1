"""The `pretrain` stage itself (not a benchmark model) on GPUs in several tensor x pipeline x data
layouts.

For each layout the real command line trains the demo's tiny model from scratch on a packed work
folder (made beforehand on any machine: clean, mix, tokenizer and pack of the embedded Norwegian
sample), each in its own copy of the folder; its per-step losses are compared with the 1x1x1 run
(bf16: agreement within rounding noise, not bit for bit). With `--interrupt`, every layout is also
stopped by SIGUSR1 (as Slurm does before a time limit) once its first checkpoint exists, must exit
75 after writing a checkpoint, and the same command then resumes (`resume=auto`) and finishes: the
log must name the checkpoint it resumed from. A layout written `A>B` (e.g. `2x2x2>1x1x8`) is stopped
in layout A and resumed in layout B, with any other tensor, pipeline and data parallelism. The ranks run with their collectives checked (TORCH_DISTRIBUTED_DEBUG=DETAIL) and bounded
(parallel.collective_timeout_s); each run's log is kept in the scratch folder.

    python bench/pretrain_layouts.py --work work --interrupt \
        --layouts 1x1x1,2x1x1,1x2x1,1x1x2,2x1x1>1x2x1,1x2x1>1x1x2 --out pretrain_layouts.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
STOPPED = 75  # pipeline.errors.StageInterrupted.exit_code


Layout = tuple[int, int, int]


def layouts(text: str) -> list[tuple[Layout, Layout]]:
    """(layout to start in, layout to resume in) of each comma-separated `TPxPPxDP` or
    `TPxPPxDP>TPxPPxDP`."""
    runs = []
    for item in text.split(","):
        first, _, then = item.partition(">")
        start = tuple(int(n) for n in first.split("x"))
        resume = tuple(int(n) for n in then.split("x")) if then else start
        runs.append((start, resume))
    return runs


def name(layout: Layout) -> str:
    return "x".join(map(str, layout))


def command(args, layout: tuple[int, int, int], work: Path) -> list[str]:
    tp, pp, dp = layout
    return [
        sys.executable,
        "-m",
        "pipeline",
        "stage=pretrain",
        "lang=nob",
        f"work_dir={work}",
        "init=scratch",
        f"parallel.tp={tp}",
        f"parallel.pp={pp}",
        f"parallel.dp={dp}",
        f"train.steps={args.steps}",
        f"train.checkpoint_every={args.checkpoint_every}",
        "train.log_every=1",
        "train.eval_every=0",
        f"train.global_batch_size={args.global_batch}",
        f"train.micro_batch_size={args.micro}",
        f"parallel.collective_timeout_s={args.collective_timeout}",
    ]


def losses(work: Path) -> dict[int, float]:
    """The last loss logged for each step (a resumed run logs the steps after its checkpoint again)."""
    folder = work / "nob" / "pretrain"
    if not folder.is_dir():
        folder = next((work / "nob").glob(".pretrain.partial-*"))
    entries = []
    for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # the line being written
            pass
    return {entry["step"]: entry["loss"] for entry in entries if "loss" in entry}


def tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-3000:]


def stop_after_first_checkpoint(
    args, layout: Layout, work: Path, env: dict, log: Path
) -> tuple[Optional[int], str]:
    """Start the stage, send SIGUSR1 to it and its ranks once a step after the first checkpoint is
    logged; its exit code (None: it did not stop in time) and what went wrong, if anything."""
    with log.open("w", encoding="utf-8") as output:
        # Its output goes to a file: a pipe that nobody reads while it runs would fill and block its
        # logging.
        process = subprocess.Popen(
            command(args, layout, work),
            cwd=work.parent,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + args.stage_timeout
    while time.time() < deadline and process.poll() is None:
        try:
            if max(losses(work), default=0) > args.checkpoint_every:
                break
        except (StopIteration, FileNotFoundError):
            pass
        time.sleep(0.2)
    if process.poll() is not None:
        return process.returncode, f"it ended (exit {process.returncode}) before it was stopped"
    os.killpg(process.pid, signal.SIGUSR1)
    try:
        return process.wait(timeout=args.stage_timeout), ""
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None, f"it did not stop within {args.stage_timeout} s of SIGUSR1"


def run_layout(args, start: Layout, resume: Layout, source: Path, scratch: Path) -> dict:
    label = name(start) if start == resume else f"{name(start)}>{name(resume)}"
    work = scratch / label.replace(">", "-to-")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(
        source, work, ignore=shutil.ignore_patterns("*pretrain*", "*warmup*", "*evaluate*")
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if args.check_collectives:  # every collective checked to be the same on all ranks first
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    started = time.perf_counter()
    result = {"layout": label}
    if args.interrupt:
        code, problem = stop_after_first_checkpoint(args, start, work, env, work / "stop.log")
        result["stop_exit_code"] = code
        if code != STOPPED:
            result["error"] = (
                f"stopping {label}: "
                f"{problem or f'exit {code}, not {STOPPED}'}\n{tail(work / 'stop.log')}"
            )
            return result
    log = work / "run.log"
    with log.open("w", encoding="utf-8") as output:
        try:
            finished = subprocess.run(
                command(args, resume, work),
                cwd=work.parent,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=args.stage_timeout,
            )
        except subprocess.TimeoutExpired:
            result["error"] = f"{label} did not finish within {args.stage_timeout} s\n{tail(log)}"
            return result
    result["seconds"] = round(time.perf_counter() - started, 1)
    if finished.returncode != 0:
        result["error"] = f"{label} failed (exit {finished.returncode})\n{tail(log)}"
        return result
    resumed = re.search(
        r"Resuming from \S+ \(step (\d+) of", log.read_text(encoding="utf-8", errors="replace")
    )
    result["resumed_from_step"] = int(resumed.group(1)) if resumed else None
    if args.interrupt and resumed is None:
        result["error"] = (
            f"{label}: the second run did not say which checkpoint it resumed from\n{tail(log)}"
        )
        return result
    result["losses"] = losses(work)
    report = json.loads((work / "nob" / "pretrain" / "report.json").read_text(encoding="utf-8"))
    result["tokens_per_s"] = report.get("tokens_per_s")
    result["heldout_bpb_after"] = report["heldout_bpb_after"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--work", type=Path, required=True, help="a work_dir with nob's clean, mix, tokenizer, pack"
    )
    parser.add_argument(
        "--layouts",
        default="1x1x1,2x1x1,1x2x1,1x1x2",
        help="tp x pp x dp, comma-separated; "
        "A>B: stopped in layout A, resumed in B (needs --interrupt)",
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument(
        "--interrupt", action="store_true", help="stop each layout with SIGUSR1, then resume it"
    )
    parser.add_argument(
        "--stage-timeout", type=int, default=900, help="seconds each run of the stage may take"
    )
    parser.add_argument(
        "--collective-timeout",
        type=int,
        default=300,
        help="parallel.collective_timeout_s: a "
        "stuck collective fails the run within this many seconds, naming the rank",
    )
    parser.add_argument(
        "--check-collectives",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the ranks with TORCH_DISTRIBUTED_DEBUG=DETAIL (a mismatched collective fails at "
        "once, naming both ranks' collectives); slower, so tokens/s are not the benchmark's",
    )
    parser.add_argument("--scratch", type=Path, default=Path("pretrain_layouts"))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    args.scratch = args.scratch.absolute()
    args.scratch.mkdir(parents=True, exist_ok=True)
    runs = layouts(args.layouts)
    if any(start != resume for start, resume in runs) and not args.interrupt:
        sys.exit("--layouts A>B stops a run in layout A and resumes it in B: add --interrupt")
    results = [
        run_layout(args, start, resume, args.work.absolute(), args.scratch)
        for start, resume in runs
    ]
    reference = next(
        (r["losses"] for r in results if r["layout"] == "1x1x1" and "losses" in r), None
    )
    print(
        "| layout | stopped (exit) | resumed from step | final loss | max rel. diff vs 1x1x1 | "
        "held-out BPB | "
        "tokens/s | seconds |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['layout']} | {r.get('stop_exit_code', '')} | FAILED | | | | | |")
            print(r["error"], file=sys.stderr)
            continue
        steps = sorted(r["losses"])
        diff = (
            max(
                abs(r["losses"][s] - reference[s]) / abs(reference[s])
                for s in steps
                if s in reference
            )
            if reference
            else None
        )
        print(
            f"| {r['layout']} | {r.get('stop_exit_code', '-')} | {r['resumed_from_step']} | "
            f"{r['losses'][steps[-1]]:.4f} | {'' if diff is None else f'{diff:.2e}'} | "
            f"{r['heldout_bpb_after']:.4f} | {r['tokens_per_s']:,.0f} | {r['seconds']} |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
