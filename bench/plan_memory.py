"""Benchmark: the planner's memory estimate (`pipeline.memory_fit`) against real training steps of
the engine.

Each case starts its ranks (tp x pp processes, dp = 1) as fresh processes. Every rank builds
`pipeline.training.engine.build_engine`, the stages' own engine (DeepSpeed's PipelineEngine,
ZeRO-1), trains two steps on random token ids with segment ids like the packed data (the first step
creates Adam's state), then one measured step. Measured per rank:

- on a CPU (fp32, the PyTorch reference kernels, gloo): the process's resident set. glibc's mmap
  threshold is fixed at 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so that every tensor is its own mapping,
  returned to the system when freed, and the resident set follows the live tensors; the peak is
  VmHWM after resetting it through /proc/self/clear_refs just before the measured step. "base" is
  the resident set before the engine is built, after a throwaway engine of a minute model has loaded
  the ~600 modules (torch._inductor, networkx ...) that the engine imports on first use: ~150 MiB of
  code, no tensor;
- on a GPU (bf16, the Triton kernels, NCCL): `torch.cuda.max_memory_allocated`, reset just before
  the measured step, and `torch.cuda.memory_allocated` before it; base 0 (the allocator counts only
  tensors).

Columns, per rank (one row per pipeline stage; tensor-parallel ranks of a stage agree to within a
few MiB, the first is shown): the planner's peak against the measured peak above base; and what a
step adds (the planner's peak less what stays allocated between steps: weights, optimizer state, and
what the pipeline's buffers keep, the last layer's output and the send/receive tensors) against the
measured rise during the step. Ratios are planner / measured (above 1: an overestimate).

    python bench/plan_memory.py                        # the CPU cases: tiny (1 and 2 ranks), ~100M Llama and BLOOM
    python bench/plan_memory.py --cases bloom-1.3b-micro4,bloom-1.3b-micro8,bloom-1.3b-micro8-ckpt   # one GPU
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

from pipeline.model.model_config import ModelConfig  # noqa: E402
from pipeline.memory_fit.layout import Layout  # noqa: E402
from pipeline.memory_fit.memory import Numerics, stage_memory  # noqa: E402

MIB = 2**20
TINY = ModelConfig(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    ffn_size=384,
    vocab_size=8192,
    tie_embeddings=True,
    max_seq_len=256,
)  # pipeline/conf/model/tiny.yaml
LLAMA_100M = ModelConfig(
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    num_kv_heads=4,
    ffn_size=2048,
    vocab_size=32768,
    tie_embeddings=True,
    max_seq_len=512,
)
BLOOM_STYLE = dict(
    position="alibi",
    norm="layernorm",
    activation="gelu",
    embedding_norm=True,
    bias=True,
    tie_embeddings=True,
)
BLOOM_100M = ModelConfig(
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    num_kv_heads=12,
    ffn_size=3072,
    vocab_size=32768,
    max_seq_len=512,
    **BLOOM_STYLE,
)
# bench/train.py's 1.3B model (BENCHMARKS.md, "Training").
BLOOM_1B3 = ModelConfig(
    hidden_size=2048,
    num_layers=24,
    num_heads=16,
    num_kv_heads=16,
    ffn_size=8192,
    vocab_size=50304,
    max_seq_len=2048,
    **BLOOM_STYLE,
)


@dataclass(frozen=True)
class Case:
    model: ModelConfig
    micro_batch: int
    accumulation: int
    seq_len: int
    checkpoint_interval: int = 0
    tp: int = 1
    pp: int = 1
    gpu: bool = False

    def layout(self) -> Layout:
        return Layout(
            tp=self.tp,
            pp=self.pp,
            dp=1,
            micro_batch=self.micro_batch,
            accumulation=self.accumulation,
            seq_len=self.seq_len,
            checkpoint_interval=self.checkpoint_interval,
        )


CASES = {
    "tiny": Case(TINY, micro_batch=8, accumulation=2, seq_len=256),
    "tiny-ckpt": Case(TINY, micro_batch=8, accumulation=2, seq_len=256, checkpoint_interval=1),
    "tiny-pp2": Case(TINY, micro_batch=8, accumulation=4, seq_len=256, pp=2),
    "tiny-tp2": Case(TINY, micro_batch=8, accumulation=2, seq_len=256, tp=2),
    "llama-100m": Case(LLAMA_100M, micro_batch=2, accumulation=2, seq_len=512),
    "llama-100m-ckpt": Case(
        LLAMA_100M, micro_batch=2, accumulation=2, seq_len=512, checkpoint_interval=1
    ),
    "bloom-100m": Case(BLOOM_100M, micro_batch=2, accumulation=2, seq_len=512),
    "bloom-1.3b-micro4": Case(BLOOM_1B3, micro_batch=4, accumulation=8, seq_len=2048, gpu=True),
    "bloom-1.3b-micro8": Case(BLOOM_1B3, micro_batch=8, accumulation=8, seq_len=2048, gpu=True),
    "bloom-1.3b-micro8-ckpt": Case(
        BLOOM_1B3, micro_batch=8, accumulation=8, seq_len=2048, checkpoint_interval=1, gpu=True
    ),
}
CPU_CASES = [name for name, case in CASES.items() if not case.gpu]


def planned(case: Case, stage: int) -> dict:
    """The planner's numbers for a rank of pipeline stage `stage`."""
    numerics = (
        Numerics(value_bytes=2, flash=True, host=False)
        if case.gpu
        else Numerics(4, flash=False, host=True)
    )
    memory = stage_memory(case.model, case.layout(), numerics, stage)
    return {
        "parameters": memory.parameters,
        "peak": memory.peak,
        "phase": memory.phase,
        "step": memory.peak - memory.between_steps,
    }


def _status_kib(field: str) -> int:
    return int(
        re.search(
            rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE
        ).group(1)
    )


def measure(name: str) -> dict:
    """This rank's part of one case (in a process that `run_case` started with the environment it
    needs)."""
    import numpy as np
    import torch

    from safetensors.torch import save_file

    from pipeline.model.transformer import Transformer
    from pipeline.parallel.parallel_config import ParallelConfig
    from pipeline.training.train_config import TrainConfig
    from pipeline.training.engine import build_engine, init_distributed
    from pipeline.training.heldout import micro_batches

    case = CASES[name]
    init_distributed(ParallelConfig().collective_timeout_s)
    gpu = torch.cuda.is_available()
    if case.gpu != gpu:
        raise SystemExit(
            f"case {name} is for a {'GPU' if case.gpu else 'CPU'}; this process sees "
            f"{'a GPU' if gpu else 'none'}"
        )
    parallel = ParallelConfig(tp=case.tp, pp=case.pp)

    def train_steps(model: ModelConfig, steps: int, folder: Path):
        """The engine for `model` with the case's layout and batch after `steps` steps, and its step
        function."""
        train = TrainConfig(
            steps=10**6,
            global_batch_size=case.micro_batch * case.accumulation,
            micro_batch_size=case.micro_batch,
            seq_len=case.seq_len,
            schedule="constant",
            warmup_steps=0,
            precision="bf16" if gpu else "fp32",
            activation_checkpoint_interval=case.checkpoint_interval,
        )
        init = folder / f"init-{model.hidden_size}.safetensors"
        if (
            int(os.environ["RANK"]) == 0
        ):  # the initial weights with single-model names, a tied head once
            torch.manual_seed(1)
            state = Transformer(model).state_dict()
            save_file(
                {
                    name: tensor.contiguous()
                    for name, tensor in state.items()
                    if name != "head.weight"
                },
                str(init),
            )
        if torch.distributed.get_world_size() > 1:
            torch.distributed.barrier()
        built = build_engine(model, train, parallel, init, lambda _: True)
        generator = np.random.default_rng(1)  # the same batches on every rank
        rows = case.micro_batch * case.accumulation

        def step() -> float:
            tokens = generator.integers(0, model.vocab_size, (rows, case.seq_len + 1))
            # Documents of about a quarter of a row each, packed as the pack stage's sampler gives
            # them.
            segments = np.cumsum(
                generator.random((rows, case.seq_len + 1)) < 4 / case.seq_len, axis=1
            )
            return float(
                built.engine.train_batch(
                    iter(micro_batches(tokens, segments, case.micro_batch, built.engine.device))
                )
            )

        return built.engine, [step() for _ in range(steps)], step

    folder = Path(os.environ["PLAN_MEMORY_DIR"])
    if not gpu:
        minute = replace(
            case.model,
            hidden_size=64,
            num_layers=case.pp,
            num_heads=2,
            num_kv_heads=2,
            ffn_size=128,
            vocab_size=128,
        )
        train_steps(minute, 1, folder)
        gc.collect()
    base = 0 if gpu else _status_kib("VmRSS") * 1024
    engine, losses, step = train_steps(case.model, 2, folder)
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
    return {
        "case": name,
        "rank": int(os.environ["RANK"]),
        "stage": engine.stage_id,
        "base": base,
        "before": before,
        "peak": peak,
        "losses": losses,
        "device": device,
        "parameters": sum(p.numel() for p in engine.module.parameters()),
        "torch": torch.__version__,
    }


def run_case(name: str) -> list[dict]:
    """Every rank's measurement of one case, the ranks started as fresh processes."""
    case = CASES[name]
    world = case.tp * case.pp
    with tempfile.TemporaryDirectory() as folder:
        path = os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
        )  # keep installed extras
        env = {
            **os.environ,
            "PYTHONPATH": path,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29517",
            "WORLD_SIZE": str(world),
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "PLAN_MEMORY_DIR": folder,
            "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world)),
        }
        results = [Path(folder) / f"rank{rank}.json" for rank in range(world)]
        ranks = [
            subprocess.Popen(
                [sys.executable, __file__, f"--measure={name}", f"--result={result}"],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank, result in enumerate(results)
        ]
        logs = [process.communicate()[0] for process in ranks]
        for process, result, log in zip(ranks, results, logs):
            if process.returncode != 0 or not result.exists():
                raise SystemExit(f"case {name} failed ({process.returncode}):\n{log[-4000:]}")
        return [json.loads(result.read_text(encoding="utf-8")) for result in results]


def table(rows: list[tuple[dict, dict]]) -> str:
    lines = [
        (
            "| case | layout | stage | parameters | micro x seq, accumulation | ckpt | planned "
            "peak (MiB) | at | "
            "measured peak above base (MiB) | ratio | planned step (MiB) | measured step rise "
            "(MiB) | ratio |"
        ),
        "|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for measured, plan in rows:
        case = CASES[measured["case"]]
        total = measured["peak"] - measured["base"]
        rise = measured["peak"] - measured["before"]
        lines.append(
            f"| {measured['case']} | {case.layout().describe()} | {measured['stage']} | "
            f"{measured['parameters']:,} | "
            f"{case.micro_batch} x {case.seq_len}, {case.accumulation} | "
            f"{case.checkpoint_interval} | "
            f"{plan['peak'] / MIB:,.0f} | {plan['phase']} | {total / MIB:,.0f} | "
            f"{plan['peak'] / total:.2f} | "
            f"{plan['step'] / MIB:,.0f} | {rise / MIB:,.0f} | {plan['step'] / rise:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default=",".join(CPU_CASES), help=f"comma-separated, of: {', '.join(CASES)}"
    )
    parser.add_argument(
        "--out", default=None, help="also write the table and the results (JSON) here"
    )
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        Path(args.result).write_text(json.dumps(measure(args.measure)), encoding="utf-8")
        return
    rows, results = [], []
    for name in args.cases.split(","):
        ranks = run_case(name)
        results += ranks
        for stage in sorted({rank["stage"] for rank in ranks}):
            measured = min(
                (rank for rank in ranks if rank["stage"] == stage), key=lambda rank: rank["rank"]
            )
            plan = planned(CASES[name], stage)
            if plan["parameters"] != measured["parameters"]:
                print(
                    f"{name} stage {stage}: the planner counts {plan['parameters']:,} parameters, "
                    "the engine "
                    f"holds {measured['parameters']:,}",
                    flush=True,
                )
            rows.append((measured, plan))
            print(
                f"{name} stage {stage}: planned {plan['peak'] / MIB:,.0f} MiB ({plan['phase']}), "
                "measured "
                f"{(measured['peak'] - measured['base']) / MIB:,.0f} MiB above base; losses "
                f"{measured['losses']}",
                flush=True,
            )
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(
            text + "\n\n" + json.dumps(results, indent=1) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()
