"""Benchmark: the host memory of every process of `stage=warmup` and `stage=pretrain init=hf` at
tp=2 x pp=2 on a CPU (gloo), for a random Llama-style Hugging Face folder of about 0.8B parameters:
tests/e2e/test_rank_memory.py's procedure at the size its acceptance names (the suite runs it with
~100M parameters, for time and memory).

Each stage reports the peak resident set (VmHWM) of its launching process and of every rank in its
marker; an "idle" run (pretrain init=scratch of the tiny model at the same layout: the same code,
next to no weights) is subtracted. Printed per process: the peak, the peak above idle, and that as a
multiple of the model's fp32 bytes.

    python bench/rank_memory.py --dir .rank_memory --chain-only   # anywhere: clean .. pack of the nob sample
    CUDA_VISIBLE_DEVICES= python3 bench/rank_memory.py --dir .rank_memory --out rank_memory.md   # ~40 GB of memory
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import CHAIN_OPTIONS, marker, packed_copy, run_cli  # noqa: E402

# noqa: E402
from tests.test_rank_memory import GIB, IDLE, LAYOUT, SHORT, fp32_bytes, llama_base, peaks

# ~0.79B parameters with the chain's 2048-token vocabulary: 16 blocks of 47M, untied embeddings.
SIZE_0_8B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "intermediate_size": 5632,
}


def chain(folder: Path) -> None:
    """clean .. pack of the embedded Norwegian sample into `folder`/work, unless it is there."""
    if (folder / "work" / "nob" / "pack" / "_SUCCESS.json").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    for stage in ("clean", "mix", "tokenizer", "pack"):
        run_cli(f"stage={stage}", *CHAIN_OPTIONS, cwd=folder)


def fresh_copy(folder: Path, name: str) -> Path:
    """`folder`/`name`: a new copy of the packed chain, to run stages in."""
    shutil.rmtree(folder / name, ignore_errors=True)
    return packed_copy(folder, folder / name)


def timed(label: str, *overrides: str, cwd: Path) -> None:
    started = time.perf_counter()
    run_cli(*overrides, cwd=cwd)
    print(f"{label}: {time.perf_counter() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir", type=Path, required=True, help="the packed chain and the runs go here"
    )
    parser.add_argument("--chain-only", action="store_true", help="only make the packed chain")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    folder = args.dir.absolute()
    chain(folder)
    if args.chain_only:
        return

    idle = fresh_copy(folder, "idle")
    timed("idle run", *IDLE, *LAYOUT, cwd=idle)
    base = folder / "base-0.8b"
    if not (base / "model.safetensors.index.json").is_file():
        started = time.perf_counter()
        shutil.rmtree(base, ignore_errors=True)
        llama_base(base, folder / "work" / "nob" / "tokenizer", SIZE_0_8B)
        print(f"base folder: {time.perf_counter() - started:.0f} s", flush=True)
    model = fp32_bytes(base) / GIB
    large = fresh_copy(folder, "large")
    for stage in ("warmup", "pretrain"):
        timed(
            stage,
            f"stage={stage}",
            *CHAIN_OPTIONS,
            *LAYOUT,
            *SHORT,
            "export.max_shard_size=1GB",
            f"model.base={base}",
            "init=hf",
            cwd=large,
        )

    idle_peaks = peaks(idle, "pretrain")
    ranks = {
        stage: marker(large / "work", "nob", stage)["metrics"]["peak_memory_per_rank"]
        for stage in ("warmup", "pretrain")
    }
    lines = [
        f"model: {model:.3f} GiB in fp32; machine: {platform.node()}, {os.cpu_count()} CPUs; "
        f"idle process {idle_peaks['process']:.3f} GiB, idle ranks "
        + ", ".join(f"{value:.3f}" for value in idle_peaks["ranks"])
        + " GiB",
        "",
        "| stage | process | peak (GiB) | above idle (GiB) | above idle / model |",
        "|---|---|---:|---:|---:|",
    ]
    for stage in ("warmup", "pretrain"):
        measured = peaks(large, stage)
        rows = [("launching process", measured["process"], idle_peaks["process"])]
        rows += [
            (
                f"rank {rank['rank']} (tp {rank['tp']}, pp {rank['pp']})",
                rank["host_rss_gib"],
                idle_rank,
            )
            for rank, idle_rank in zip(ranks[stage], idle_peaks["ranks"])
        ]
        lines += [
            f"| {stage} | {name} | {peak:.3f} | {peak - idle_value:.3f} | "
            f"{(peak - idle_value) / model:.2f} |"
            for name, peak, idle_value in rows
        ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
