"""Benchmark (issue 57, build 2): can a tensor-parallel block hide its forward all-reduces?

One transformer block of the training model (pipeline.model.transformer.Block, cut by
pipeline.parallel.tensor_parallel.apply_tensor_parallel) trains forward and backward on one
micro-batch, timed with CUDA events, in variants that change only how the row-parallel layers'
output all-reduces run:
- shipped: as the training stages run it (each all-reduce after its whole product; the backward's
  input-gradient all-reduce already runs beside the weight-gradient products);
- chunks=N: the row-parallel product cut into N runs of tokens, each run's all-reduce started
  (NCCL's stream) while the next run's product is computed;
- +priority: the tensor-parallel group's NCCL stream at high priority, so that its kernels get SMs
  ahead of the queued GEMMs';
- +carveout=S: cuBLAS told to leave S SMs free (torch._C._set_sm_carveout_experimental) for the
  collectives that run beside it.
Rank 0 also times the unsplit block alone; efficiency = t(1 GPU) / (tp x t(variant)), the fraction
of tp single GPUs' work that the block keeps.

    torchrun --nproc-per-node=2 bench/tp_overlap.py                 # Llama-3-8B's block widths
    torchrun --nproc-per-node=2 bench/tp_overlap.py --smoke         # tiny, fp32, gloo on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.train import SHAPES, model_config  # noqa: E402
from pipeline.model.transformer import Block  # noqa: E402
from pipeline.parallel import tensor_parallel  # noqa: E402


def block_config(smoke: bool, seq_len: int):
    """One block of bench/train.py's 7B shape (Llama-3-8B's widths), or a tiny one."""
    shape = dict(SHAPES["7b"], layers=1)
    if smoke:
        shape.update(hidden=64, heads=4, kv_heads=2, ffn=128)
    return model_config(argparse.Namespace(model="rope", seq_len=seq_len, init_std=0.02, **shape))


class _ChunkedRowParallel(torch.autograd.Function):
    """x W^T summed over the ranks, the product cut into runs of tokens whose all-reduces start as
    soon as each run is computed. Backward: the gradient is whole on every rank, so x's and W's are
    local products (as for the shipped layer)."""

    @staticmethod
    def forward(ctx, x, weight, group, chunks):
        ctx.save_for_backward(x, weight)
        rows = x.reshape(-1, x.shape[-1])
        out = rows.new_empty((rows.shape[0], weight.shape[0]))
        pending = []
        for part_in, part_out in zip(rows.chunk(chunks), out.chunk(chunks)):
            torch.matmul(part_in, weight.t(), out=part_out)
            pending.append(dist.all_reduce(part_out, group=group, async_op=True))
        for work in pending:
            work.wait()
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_x = (grad_rows @ weight).view(x.shape)
        grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_weight, None, None


def use_chunks(block: Block, chunks: int) -> None:
    for layer in (block.attn.out, block.mlp.down):
        assert layer.bias is None, "the chunked product adds no bias (the 7B shape has none)"
        layer.forward = lambda x, layer=layer: _ChunkedRowParallel.apply(
            x, layer.weight, layer.group, chunks
        )


def train_step(block: Block, x: torch.Tensor) -> torch.Tensor:
    """One forward and backward of the block; its output."""
    out = block(x)
    out.float().square().mean().backward()
    return out


def time_block(
    block: Block, x: torch.Tensor, warmup: int, iterations: int, across_ranks: bool = True
) -> float:
    """Median milliseconds of one forward and backward (with `across_ranks`, the slowest rank's).
    Not triton's do_bench: it picks its repetitions from a first timing, which can differ between
    ranks and leave one rank's collectives unmatched."""
    for _ in range(warmup):
        train_step(block, x)
    times = []
    for _ in range(iterations):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            train_step(block, x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begun = time.perf_counter()
            train_step(block, x)
            times.append(1000 * (time.perf_counter() - begun))
    mine = torch.tensor([statistics.median(times)], device=x.device)
    if across_ranks:
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def output_and_input_grad(block: Block, x: torch.Tensor) -> torch.Tensor:
    """The block's output and the input's gradient, flattened into one tensor."""
    x = x.detach().requires_grad_()
    out = train_step(block, x)
    return torch.cat((out.detach().flatten(), x.grad.flatten())).float()


def collective_overlap(block: Block, x: torch.Tensor, iterations: int = 2) -> dict:
    """Per forward and backward, from rank 0's kernels (torch.profiler): NCCL's milliseconds, and
    how many of them ran while a computing kernel ran too (the rest is exposed unless the GPU had
    nothing else to do)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        # The ranks start their profilers at different times: the barrier's kernel (the first
        # NCCL one) waits for the last, and only the kernels after it are counted.
        dist.barrier()
        for _ in range(iterations):
            train_step(block, x)
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    barrier = next((e for e in kernels if "nccl" in e.name.lower()), None)
    if barrier is not None:
        kernels = [e for e in kernels if e.time_range.start >= barrier.time_range.end]
    nccl = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()]
    compute = sorted(
        (e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()
    )
    busy = []  # the union of the computing kernels' intervals
    for start, end in compute:
        if busy and start <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], end)
        else:
            busy.append([start, end])
    overlapped = sum(
        max(0.0, min(end, b_end) - max(start, b_start))
        for start, end in nccl
        for b_start, b_end in busy
    )
    total = sum(end - start for start, end in nccl)
    return dict(nccl_ms=total / 1000 / iterations, overlapped_ms=overlapped / 1000 / iterations)


def new_group(priority: bool):
    if dist.get_backend() != "nccl":
        return dist.new_group()
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = priority
    return dist.new_group(backend="nccl", pg_options=options)


@contextlib.contextmanager
def sm_carveout(sms: int):
    if not sms:
        yield
        return
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny block, fp32, gloo on a CPU")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--chunks", default="2,4", help="runs of tokens to try, comma-separated")
    parser.add_argument("--carveouts", default="16,32", help="SMs left to the collectives")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=None, help="write the results (JSON) here")
    args = parser.parse_args()

    cuda = torch.cuda.is_available() and not args.smoke
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    seq = 16 if args.smoke else args.seq_len
    cfg = block_config(args.smoke, seq)
    micro = 2 if args.smoke else args.micro_batch
    warmup, iterations = (1, 2) if args.smoke else (3, args.iterations)
    torch.manual_seed(0)
    x = torch.randn(micro, seq, cfg.hidden_size, device=device, dtype=dtype, requires_grad=True)

    # One GPU: the unsplit block on rank 0 while the others wait.
    single = torch.zeros(1, device=device)
    if rank == 0:
        with torch.device(device or "cpu"):
            whole = Block(cfg).to(dtype)
        single[0] = time_block(whole, x, warmup, iterations, across_ranks=False)
        del whole
    dist.broadcast(single, 0)

    variants = [("shipped", 1, False, 0)]
    variants += [(f"chunks={c}", int(c), False, 0) for c in args.chunks.split(",") if c]
    best = max((int(c) for c in args.chunks.split(",") if c), default=1)
    variants += [(f"chunks={best} +priority", best, True, 0)]
    if cuda:
        variants += [
            (f"chunks={best} +priority +carveout={s}", best, True, int(s))
            for s in args.carveouts.split(",")
            if s
        ]
    groups = {False: new_group(False), True: new_group(True)}
    results, reference = [], None
    for name, chunks, priority, carveout in variants:
        torch.manual_seed(0)
        with torch.device(device or "cpu"):
            block = Block(cfg).to(dtype)
        block = tensor_parallel.apply_tensor_parallel(block, cfg, groups[priority])
        if chunks > 1:
            use_chunks(block, chunks)
        with sm_carveout(carveout):
            # The same computation as the shipped layers': output and input gradient compared.
            values = output_and_input_grad(block, x)
            reference = values if reference is None else reference
            difference = float((values - reference).abs().max() / reference.abs().max())
            block.zero_grad(set_to_none=True)
            ms = time_block(block, x, warmup, iterations)
            overlap = collective_overlap(block, x) if cuda else {}
        efficiency = float(single) / (tp * ms)
        results.append(
            dict(
                variant=name, tp=tp, ms=ms, efficiency=efficiency, difference=difference, **overlap
            )
        )
        if rank == 0:
            print(
                f"tp={tp} {name}: {ms:.2f} ms, {efficiency:.3f} of {tp} single GPUs; largest "
                f"difference from the shipped layers' output and input gradient {difference:.1e}"
                + (
                    f"; NCCL {overlap['nccl_ms']:.2f} ms, {overlap['overlapped_ms']:.2f} of them "
                    "beside computing kernels"
                    if overlap
                    else ""
                ),
                flush=True,
            )
        del block
    if rank == 0:
        device_name = torch.cuda.get_device_name() if cuda else "CPU"
        report = dict(device=device_name, single_gpu_ms=float(single), results=results)
        print(json.dumps(report))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
