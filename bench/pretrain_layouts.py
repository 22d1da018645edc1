"""The `pretrain` stage itself (not a benchmark model) on GPUs in several tensor x pipeline x data layouts.

For each layout the real command line trains the demo's tiny model from scratch on a packed work folder (made
beforehand on any machine: clean, mix, tokenizer and pack of the embedded Norwegian sample), each in its own copy
of the folder; its per-step losses are compared with the 1x1x1 run (bf16: agreement within rounding noise, not
bit for bit). With `--interrupt`, every layout is also stopped by SIGUSR1 (as Slurm does before a time limit) once
its first checkpoint exists, must exit 75 after writing a checkpoint, and the same command then resumes
(`resume=auto`) and finishes: the log must name the checkpoint it resumed from.

    python bench/pretrain_layouts.py --work work --layouts 1x1x1,2x1x1,1x2x1,1x1x2 --interrupt
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

REPO = Path(__file__).resolve().parent.parent
STOPPED = 75  # pipeline.errors.StageInterrupted.exit_code


def layouts(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",")]


def command(args, layout: tuple[int, int, int], work: Path) -> list[str]:
    tp, pp, dp = layout
    return [sys.executable, "-m", "pipeline", "stage=pretrain", "lang=nob", f"work_dir={work}", "init=scratch",
            f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}", f"train.steps={args.steps}",
            f"train.checkpoint_every={args.checkpoint_every}", "train.log_every=1", "train.eval_every=0",
            f"train.global_batch_size={args.global_batch}", f"train.micro_batch_size={args.micro}"]


def losses(work: Path) -> dict[int, float]:
    """The last loss logged for each step (a resumed run logs the steps after its checkpoint again)."""
    folder = work / "nob" / "pretrain"
    if not folder.is_dir():
        folder = next((work / "nob").glob(".pretrain.partial-*"))
    entries = [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {entry["step"]: entry["loss"] for entry in entries if "loss" in entry}


def run_layout(args, layout, source: Path, scratch: Path) -> dict:
    work = scratch / "x".join(map(str, layout))
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work, ignore=shutil.ignore_patterns("*pretrain*", "*warmup*", "*evaluate*"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    result = {"layout": "x".join(map(str, layout))}
    if args.interrupt:
        process = subprocess.Popen(command(args, layout, work), cwd=scratch, env=env, stderr=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, text=True, start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            try:
                if max(losses(work), default=0) > args.checkpoint_every:
                    break
            except (StopIteration, FileNotFoundError):
                pass
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGUSR1)
        _, stderr = process.communicate(timeout=300)
        result["stop_exit_code"] = process.returncode
        if process.returncode != STOPPED:
            result["error"] = stderr[-3000:]
            return result
    finished = subprocess.run(command(args, layout, work), cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=600)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if finished.returncode != 0:
        result["error"] = finished.stderr[-3000:]
        return result
    resumed = re.search(r"Resuming from \S+ \(step (\d+) of", finished.stdout + finished.stderr)
    result["resumed_from_step"] = int(resumed.group(1)) if resumed else None
    result["losses"] = losses(work)
    report = json.loads((work / "nob" / "pretrain" / "report.json").read_text(encoding="utf-8"))
    result["tokens_per_s"] = report.get("tokens_per_s")
    result["heldout_bpb_after"] = report["heldout_bpb_after"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="a work_dir with nob's clean, mix, tokenizer, pack")
    parser.add_argument("--layouts", default="1x1x1,2x1x1,1x2x1,1x1x2", help="tp x pp x dp, comma-separated")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--interrupt", action="store_true", help="stop each layout with SIGUSR1, then resume it")
    parser.add_argument("--scratch", type=Path, default=Path("pretrain_layouts"))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    args.scratch = args.scratch.absolute()
    args.scratch.mkdir(parents=True, exist_ok=True)
    results = [run_layout(args, layout, args.work.absolute(), args.scratch) for layout in layouts(args.layouts)]
    reference = next((r["losses"] for r in results if r["layout"] == "1x1x1" and "losses" in r), None)
    print("| layout | stopped (exit) | resumed from step | final loss | max rel. diff vs 1x1x1 | held-out BPB | "
          "tokens/s | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['layout']} | {r.get('stop_exit_code', '')} | FAILED | | | | | |")
            print(r["error"], file=sys.stderr)
            continue
        steps = sorted(r["losses"])
        diff = (max(abs(r["losses"][s] - reference[s]) / abs(reference[s]) for s in steps if s in reference)
                if reference else None)
        print(f"| {r['layout']} | {r.get('stop_exit_code', '-')} | {r['resumed_from_step']} | "
              f"{r['losses'][steps[-1]]:.4f} | {'' if diff is None else f'{diff:.2e}'} | "
              f"{r['heldout_bpb_after']:.4f} | {r['tokens_per_s']:,.0f} | {r['seconds']} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
