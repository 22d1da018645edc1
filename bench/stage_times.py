"""Where a language's `stage=all` spends its time, and whether the node is busy meanwhile: each
stage's wall time with the cores and GPUs it kept busy, from raw files to the report.

    python bench/stage_times.py --out bench/results/stage_times -- lang=nob raw_dir=<raw> \\
        work_dir=<work> model.base=<SmolLM2-135M> workers=16 parallel.dp=4

Everything after `--` goes to `python -m pipeline stage=all` as it is. The script reads the
pipeline's log lines ("Running <stage> for <lang>", "<stage> for <lang> finished", "Skipping
<stage> ...") to cut the run into stages, and samples the machine every second: busy cores from
/proc/stat (all processes: run it on a node of its own), busy GPUs from `nvidia-smi`'s utilisation
(the sum over GPUs, 1.0 = one GPU busy all the time). It prints the table and writes `table.md`,
`samples.jsonl` and the run's log into `--out`; bench/compact_results.py makes the file that
BENCHMARKS.md cites.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

RUNNING = re.compile(r"Running (?P<stage>\w+) for (?P<lang>\w+)")
FINISHED = re.compile(r"(?P<stage>\w+) for (?P<lang>\w+) finished")
SAMPLE_EVERY_S = 1.0


@dataclass
class Span:
    stage: str
    lang: str
    start: float
    end: float | None = None


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, total) jiffies over all cores, and the number of cores; None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    fields = [int(value) for value in lines[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    cores = sum(1 for line in lines if re.match(r"cpu\d", line))
    return sum(fields) - idle, sum(fields), cores


def _gpu_busy() -> tuple[float, int] | None:
    """The summed utilisation of the GPUs (1.0 = one GPU busy) and their number; None without
    nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(float(value) for value in out) / 100, len(out)


def sample(samples: list[dict], stop: threading.Event) -> None:
    """Appends {t, cores_busy, gpus_busy} every second until `stop` is set."""
    previous = _cpu_jiffies()
    while not stop.wait(SAMPLE_EVERY_S):
        now = _cpu_jiffies()
        cores = None
        if now is not None and previous is not None and now[1] > previous[1]:
            cores = (now[0] - previous[0]) / (now[1] - previous[1]) * now[2]
        previous = now
        gpus = _gpu_busy()
        samples.append(
            {
                "t": time.time(),
                "cores_busy": cores,
                "gpus_busy": None if gpus is None else gpus[0],
                "gpus": None if gpus is None else gpus[1],
            }
        )


def spans(events: list[tuple[float, str]]) -> list[Span]:
    """The stages that ran, from (time, log line) pairs; a stage skipped as up to date is not one."""
    found: list[Span] = []
    for at, line in events:
        if match := RUNNING.search(line):
            found.append(Span(match["stage"], match["lang"], at))
        elif match := FINISHED.search(line):
            for span in reversed(found):
                if (span.stage, span.lang) == (match["stage"], match["lang"]) and span.end is None:
                    span.end = at
                    break
    return found


def _mean(values: list[float]) -> float | None:
    values = [value for value in values if value is not None]
    return sum(values) / len(values) if values else None


def table(found: list[Span], samples: list[dict], started: float, ended: float) -> str:
    """The Markdown table: per stage its wall time and mean busy cores and GPUs; then the whole
    run's wall time, the share of it that some GPU worked, and the GPUs' mean utilisation (GPU time
    used over GPU time there was)."""
    rows = [
        "| stage | wall | cores busy (mean) | GPUs busy (mean) |",
        "|---|---:|---:|---:|",
    ]
    for span in found:
        end = span.end if span.end is not None else ended
        inside = [s for s in samples if span.start <= s["t"] < end]
        cells = [_mean([s[key] for s in inside]) for key in ("cores_busy", "gpus_busy")]
        rows.append(
            f"| {span.stage} {span.lang}{'' if span.end else ' (did not finish)'} "
            f"| {(end - span.start) / 60:.1f} min | "
            + " | ".join("-" if cell is None else f"{cell:.1f}" for cell in cells)
            + " |"
        )
    summary = f"Whole run: {(ended - started) / 60:.1f} min"
    measured = [s for s in samples if s["gpus"]]
    if measured:
        working = sum(1 for s in measured if s["gpus_busy"] > 0) / len(measured)
        used = _mean([s["gpus_busy"] / s["gpus"] for s in measured])
        summary += (
            f"; a GPU at work {working:.0%} of it; the {measured[0]['gpus']} GPUs {used:.0%} used"
        )
    return "\n".join(rows) + f"\n\n{summary}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for table.md and the log")
    parser.add_argument("overrides", nargs="*", help="after --: python -m pipeline's key=value")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pipeline", "stage=all", *args.overrides]
    samples: list[dict] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(samples, stop), daemon=True)
    events: list[tuple[float, str]] = []
    started = time.time()
    sampler.start()
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each log line as it comes
    with (
        (args.out / "run_log.txt").open("w", encoding="utf-8") as log,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=environment,
        ) as process,
    ):
        for line in process.stdout:
            events.append((time.time(), line))
            log.write(line)
    ended = time.time()
    stop.set()
    sampler.join()
    text = f"`{' '.join(command[1:])}`\n\n" + table(spans(events), samples, started, ended)
    (args.out / "table.md").write_text(text, encoding="utf-8")
    with (args.out / "samples.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in samples)
    print(text)
    sys.exit(process.returncode)


if __name__ == "__main__":
    main()
