"""Benchmark: what a training rank holds after building its engine and loading its share of the
starting model.

Starts tp x pp ranks (gloo on a CPU, dp = 1) as fresh processes. Each imports the engine, builds and
loads a throwaway minute engine (so that the modules torch and DeepSpeed import on first use are in
the base), reads its resident set (base), resets its high-water mark, then builds the real engine
from a single-model safetensors file (`pipeline.training.engine.build_engine`: layers,
tensor-parallel cut, weights, DeepSpeed's ZeRO-1 optimizer) and reads VmHWM. Reported per rank: the
peak above base, and the parameters it holds, against the full model's fp32 bytes. glibc's mmap
threshold is 64 KiB so that freed tensors leave the resident set (as in bench/plan_memory.py).

    python bench/rank_load_memory.py                     # the package of this checkout
    python bench/rank_load_memory.py --repo /tmp/older   # another checkout's package, to compare
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

MIB = 2**20
# A Llama-style model of about 160M parameters with untied embeddings (0.65 GB in fp32).
SHAPE = dict(
    hidden_size=1024,
    num_layers=8,
    num_heads=16,
    num_kv_heads=8,
    ffn_size=2816,
    vocab_size=32768,
    tie_embeddings=False,
    max_seq_len=256,
)


def _status_kib(field: str) -> int:
    return int(
        re.search(
            rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE
        ).group(1)
    )


def measure(folder: Path, tp: int, pp: int) -> dict:
    import torch
    from safetensors.torch import save_file

    from pipeline.model.model_config import ModelConfig
    from pipeline.model.transformer import Transformer
    from pipeline.parallel.parallel_config import ParallelConfig
    from pipeline.training.train_config import TrainConfig
    from pipeline.training.engine import build_engine, init_distributed

    init_distributed(ParallelConfig().collective_timeout_s)
    rank = torch.distributed.get_rank()
    model = ModelConfig(**SHAPE)
    minute = replace(
        model,
        hidden_size=64,
        num_layers=pp,
        num_heads=8,
        num_kv_heads=8,
        ffn_size=128,
        vocab_size=256,
    )
    train = TrainConfig(
        steps=10, global_batch_size=2, micro_batch_size=1, seq_len=64, precision="fp32"
    )
    for cfg, name in ((minute, "minute"), (model, "model")):
        if rank == 0:
            torch.manual_seed(1)
            save_file(
                {key: tensor.contiguous() for key, tensor in Transformer(cfg).state_dict().items()},
                str(folder / f"{name}.safetensors"),
            )
        torch.distributed.barrier()
    build_engine(
        minute, train, ParallelConfig(tp=tp, pp=pp), folder / "minute.safetensors", lambda _: True
    )
    base = _status_kib("VmRSS") * 1024
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    built = build_engine(
        model, train, ParallelConfig(tp=tp, pp=pp), folder / "model.safetensors", lambda _: True
    )
    peak = _status_kib("VmHWM") * 1024
    held = sum(p.numel() for p in built.engine.module.parameters())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # gloo's threads stopped before the process exits
    return {
        "rank": rank,
        "stage": built.engine.stage_id,
        "base": base,
        "peak": peak,
        "held_parameters": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repo",
        default=str(Path(__file__).resolve().parent.parent),
        help="the checkout whose `pipeline` package runs",
    )
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        folder = Path(args.rank_of)
        result = measure(folder, args.tp, args.pp)
        (folder / f"rank{result['rank']}.json").write_text(json.dumps(result), encoding="utf-8")
        return
    world = args.tp * args.pp
    with tempfile.TemporaryDirectory() as folder:
        env = {
            **os.environ,
            "PYTHONPATH": args.repo,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29533",
            "WORLD_SIZE": str(world),
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "OMP_NUM_THREADS": "1",
        }
        command = [
            sys.executable,
            __file__,
            f"--rank-of={folder}",
            f"--tp={args.tp}",
            f"--pp={args.pp}",
        ]
        ranks = [
            subprocess.Popen(
                command,
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]
        logs = [process.communicate()[0] for process in ranks]
        for process, log in zip(ranks, logs):
            if process.returncode != 0:
                raise SystemExit(f"a rank failed ({process.returncode}):\n{log[-4000:]}")
        results = [
            json.loads((Path(folder) / f"rank{r}.json").read_text(encoding="utf-8"))
            for r in range(world)
        ]
    sys.path.insert(0, args.repo)
    from pipeline.model.model_config import ModelConfig
    from pipeline.model.model_config import parameter_count

    full_bytes = 4 * parameter_count(ModelConfig(**SHAPE))
    print(
        f"package: {args.repo}; tp={args.tp} x pp={args.pp}; full model {full_bytes / MIB:,.0f} "
        "MiB in fp32"
    )
    print("| rank | stage | parameters held | peak above base (MiB) | / full model fp32 |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        above = r["peak"] - r["base"]
        print(
            f"| {r['rank']} | {r['stage']} | {r['held_parameters']:,} | {above / MIB:,.0f} | "
            f"{above / full_bytes:.2f} |"
        )


if __name__ == "__main__":
    main()
