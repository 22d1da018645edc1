"""Benchmark: the planner's memory estimate (`pipeline.planning`) against real training steps of the engine.

Each case runs in a fresh process on one rank (tp = pp = dp = 1): `pipeline.training.engine.build_engine`, the
stages' own engine (DeepSpeed's PipelineEngine, ZeRO-1), trains `--warmup` steps on random token ids with segment
ids like the packed data (the first step creates Adam's state), then one measured step. Measured:

- on a CPU (fp32, the PyTorch reference kernels): the process's resident set. glibc's mmap threshold is fixed
  at 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so that every tensor is its own mapping, returned to the system when freed,
  and the resident set follows the live tensors; the peak is VmHWM after resetting it through
  /proc/self/clear_refs just before the measured step. "base" is the resident set before the engine is built
  (Python, torch, DeepSpeed, the process group);
- on a GPU (bf16, the Triton kernels): `torch.cuda.max_memory_allocated`, reset just before the measured step,
  and `torch.cuda.memory_allocated` before it; base 0 (the allocator counts only tensors).

Columns: the planner's peak per rank against the measured peak above base; and the part of the step the planner
calls activations (its peak less what stays allocated between steps: weights, optimizer state, the logits the
pipeline keeps, its send/receive buffers) against the measured rise during the step. Ratios are planner /
measured (1.00: exact; above 1: the planner overestimates).

    python bench/plan_memory.py                          # the CPU cases (tiny, ~100M Llama- and BLOOM-style)
    python bench/plan_memory.py --cases bloom-1.3b-micro4,bloom-1.3b-micro8   # one GPU: bench/train.py's model
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.model.config import ModelConfig  # noqa: E402
from pipeline.planning.layout import Layout  # noqa: E402
from pipeline.planning.memory import Numerics, stage_memory  # noqa: E402

MIB = 2**20
TINY = ModelConfig(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=384, vocab_size=8192,
                   tie_embeddings=True, max_seq_len=256)  # conf/model/tiny.yaml
LLAMA_100M = ModelConfig(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, ffn_size=2048, vocab_size=32768,
                         tie_embeddings=True, max_seq_len=512)
BLOOM_STYLE = dict(position="alibi", norm="layernorm", activation="gelu", embedding_norm=True, bias=True,
                   tie_embeddings=True)
BLOOM_100M = ModelConfig(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12, ffn_size=3072,
                         vocab_size=32768, max_seq_len=512, **BLOOM_STYLE)
# bench/train.py's 1.3B model (BENCHMARKS.md, "Training").
BLOOM_1B3 = ModelConfig(hidden_size=2048, num_layers=24, num_heads=16, num_kv_heads=16, ffn_size=8192,
                        vocab_size=50304, max_seq_len=2048, **BLOOM_STYLE)


@dataclass(frozen=True)
class Case:
    model: ModelConfig
    micro_batch: int
    accumulation: int
    seq_len: int
    checkpoint_interval: int = 0
    gpu: bool = False


CASES = {
    "tiny": Case(TINY, micro_batch=8, accumulation=2, seq_len=256),
    "tiny-ckpt": Case(TINY, micro_batch=8, accumulation=2, seq_len=256, checkpoint_interval=1),
    "llama-100m": Case(LLAMA_100M, micro_batch=2, accumulation=2, seq_len=512),
    "llama-100m-ckpt": Case(LLAMA_100M, micro_batch=2, accumulation=2, seq_len=512, checkpoint_interval=1),
    "bloom-100m": Case(BLOOM_100M, micro_batch=2, accumulation=2, seq_len=512),
    "bloom-1.3b-micro4": Case(BLOOM_1B3, micro_batch=4, accumulation=8, seq_len=2048, gpu=True),
    "bloom-1.3b-micro8": Case(BLOOM_1B3, micro_batch=8, accumulation=8, seq_len=2048, gpu=True),
    "bloom-1.3b-micro8-ckpt": Case(BLOOM_1B3, micro_batch=8, accumulation=8, seq_len=2048, checkpoint_interval=1,
                                   gpu=True),
}
CPU_CASES = [name for name, case in CASES.items() if not case.gpu]


def planned(case: Case) -> dict:
    """The planner's numbers for the case's single rank."""
    layout = Layout(tp=1, pp=1, dp=1, micro_batch=case.micro_batch, accumulation=case.accumulation,
                    seq_len=case.seq_len, checkpoint_interval=case.checkpoint_interval)
    numerics = Numerics(value_bytes=2, flash=True, host=False) if case.gpu else Numerics(4, flash=False, host=True)
    memory = stage_memory(case.model, layout, numerics, stage=0)
    return {"parameters": memory.parameters, "peak": memory.peak, "phase": memory.phase,
            "step": memory.peak - memory.between_steps}


def _status_kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE).group(1))


def measure(name: str) -> dict:
    """One case in this process (started by `main` with the environment it needs)."""
    import numpy as np
    import torch

    from bench.train import write_init
    from pipeline.training.config import ParallelConfig, TrainConfig
    from pipeline.training.engine import build_engine, init_distributed
    from pipeline.training.heldout import micro_batches

    case = CASES[name]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    init_distributed()
    gpu = torch.cuda.is_available()
    if case.gpu != gpu:
        raise SystemExit(f"case {name} is for a {'GPU' if case.gpu else 'CPU'}; this process sees "
                         f"{'a GPU' if gpu else 'none'}")

    def train_steps(model: ModelConfig, steps: int, folder: Path):
        """Build the engine for `model` with the case's batch, and a function that trains one step."""
        train = TrainConfig(steps=10**6, global_batch_size=case.micro_batch * case.accumulation,
                            micro_batch_size=case.micro_batch, seq_len=case.seq_len, schedule="constant",
                            warmup_steps=0, precision="bf16" if gpu else "fp32",
                            activation_checkpoint_interval=case.checkpoint_interval)
        init = write_init(model, folder, seed=1)
        built = build_engine(model, train, ParallelConfig(), init, lambda _: True)
        init.unlink()
        generator = np.random.default_rng(1)
        rows = case.micro_batch * case.accumulation

        def step() -> float:
            tokens = generator.integers(0, model.vocab_size, (rows, case.seq_len + 1))
            # Documents of about a quarter of a row each, packed as the pack stage's sampler gives them.
            segments = np.cumsum(generator.random((rows, case.seq_len + 1)) < 4 / case.seq_len, axis=1)
            return float(built.engine.train_batch(iter(micro_batches(tokens, segments, case.micro_batch,
                                                                     built.engine.device))))
        return built.engine, [step() for _ in range(steps)], step

    with tempfile.TemporaryDirectory() as folder:
        if not gpu:
            # The engine imports ~600 modules (torch._inductor, networkx ...) on first use: ~150 MiB of resident
            # code that is no tensor. Load them with a throwaway engine of a minute model before taking the base.
            minute = replace(case.model, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=2, ffn_size=128,
                             vocab_size=128)
            train_steps(minute, 1, Path(folder))
            gc.collect()
        base = 0 if gpu else _status_kib("VmRSS") * 1024
        engine, losses, step = train_steps(case.model, 2, Path(folder))
    if gpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    losses.append(step())
    if gpu:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        device = torch.cuda.get_device_name()
    else:
        peak = _status_kib("VmHWM") * 1024
        device = "CPU"
    parameters = sum(p.numel() for p in engine.module.parameters())
    return {"case": name, "base": base, "before": before, "peak": peak, "losses": losses, "device": device,
            "parameters": parameters, "torch": torch.__version__}


def run_case(name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        done = subprocess.run([sys.executable, __file__, f"--measure={name}", f"--result={result}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0 or not result.exists():
            raise SystemExit(f"case {name} failed ({done.returncode}):\n{done.stdout[-4000:]}")
        return json.loads(result.read_text(encoding="utf-8"))


def table(rows: list[tuple[dict, dict]]) -> str:
    lines = ["| case | parameters | micro x seq, accum | ckpt | planned peak (MiB) | at | measured peak above base "
             "(MiB) | ratio | planned step (MiB) | measured step rise (MiB) | ratio |",
             "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for measured, plan in rows:
        case = CASES[measured["case"]]
        total = measured["peak"] - measured["base"]
        rise = measured["peak"] - measured["before"]
        lines.append(
            f"| {measured['case']} | {measured['parameters']:,} | {case.micro_batch} x {case.seq_len}, "
            f"{case.accumulation} | {case.checkpoint_interval} | {plan['peak'] / MIB:,.0f} | {plan['phase']} | "
            f"{total / MIB:,.0f} | {plan['peak'] / total:.2f} | {plan['step'] / MIB:,.0f} | {rise / MIB:,.0f} | "
            f"{plan['step'] / rise:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CPU_CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--out", default=None, help="also write the table and the results (JSON) here")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        Path(args.result).write_text(json.dumps(measure(args.measure)), encoding="utf-8")
        return
    rows = []
    for name in args.cases.split(","):
        measured = run_case(name)
        plan = planned(CASES[name])
        if plan["parameters"] != measured["parameters"]:
            print(f"{name}: the planner counts {plan['parameters']:,} parameters, the engine holds "
                  f"{measured['parameters']:,}", flush=True)
        rows.append((measured, plan))
        print(f"{name}: planned {plan['peak'] / MIB:,.0f} MiB ({plan['phase']}), measured "
              f"{(measured['peak'] - measured['base']) / MIB:,.0f} MiB above base; losses {measured['losses']}",
              flush=True)
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n\n" + json.dumps([m for m, _ in rows], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
