"""Tune the attention kernel's launch table: time candidate tile/warp/stage settings of each kernel
on this GPU.

The table in pipeline/kernels/launch_configs.py is fixed (no autotuning at run time); this script is
how its entries are chosen on a new GPU. For each head dim it times the forward alone for every
forward candidate, then forward+backward for every dK/dV candidate (dQ at its table value) and every
dQ candidate (dK/dV at its table value), causal with ALiBi in bf16, and prints TFLOP/s (same FLOP
count as bench/attention.py). A candidate is block_m,block_n,num_warps,num_stages; one that fails to
compile or run is reported, not fatal. Each line also gives the swept kernel's registers per thread
and the bytes it spills to local memory (as the driver reports them for the compiled kernel): a
spilling candidate is timed too, so that its cost is measured rather than assumed.

    python bench/attention_configs.py
    python bench/attention_configs.py --shape 128=1,16,8192,128 --forward 128,128,8,3 128,64,8,4
    python bench/attention_configs.py --packed --shape 128=4,16,2048,128   # the document-mask entries, packed rows
    python bench/attention_configs.py --shape 128=4,16,2048,128,4           # GQA: 4 key/value heads for 16 query heads

With `--packed` the rows hold documents (bench/attention.py's packed rows, mean 700 tokens), the
table is the document-mask entry, TFLOP/s count the pairs the document mask keeps and times are
CUDA-graph replays (as in bench/attention.py: a packed case takes a fraction of a millisecond, less
than the host needs to launch it); an entry must compile without spills
(tests/unit/kernels/test_kernels_compile.py) before it goes into the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# noqa: E402
from pipeline.kernels.launch_configs import KernelConfig, attention_configs, current_arch

SHAPES = {128: (1, 16, 8192, 128), 64: (2, 32, 4096, 64)}
CANDIDATES = {
    "forward": [
        "128,64,8,3",
        "128,64,8,4",
        "128,128,8,2",
        "128,128,8,3",
        "64,64,4,4",
        "128,64,4,3",
    ],
    "backward_kv": [
        "32,128,8,2",
        "64,128,8,2",
        "32,128,4,2",
        "64,64,4,2",
        "32,64,4,3",
        "64,128,8,1",
    ],
    "backward_q": [
        "128,64,8,3",
        "128,32,4,3",
        "64,64,4,3",
        "128,64,8,2",
        "128,128,8,2",
        "64,32,4,4",
    ],
}


def parse(candidate: str) -> KernelConfig:
    return KernelConfig(*(int(x) for x in candidate.split(",")))


KERNELS = {
    "forward": "_attention_forward",
    "backward_kv": "_attention_backward_kv",
    "backward_q": "_attention_backward_q",
}


def time_candidate(shape, configs, backward: bool, packed: bool = False) -> float | None:
    """TFLOP/s of the forward (or forward+backward) with these configs; None if it failed."""
    from triton.testing import do_bench, do_bench_cudagraph

    from pipeline.kernels.attention import flash_attention

    batch, heads, seq, head_dim, kv_heads = shape if len(shape) == 5 else (*shape, shape[1])
    q = torch.randn(
        (batch, heads, seq, head_dim), device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    k, v = (
        torch.randn(
            (batch, kv_heads, seq, head_dim),
            device="cuda",
            dtype=torch.bfloat16,
            requires_grad=True,
        )
        for _ in range(2)
    )
    slopes = torch.rand(heads, device="cuda") * 0.5
    grad_out = torch.randn_like(q)
    segment_ids = None
    flops = 2.0 * batch * heads * seq * seq * head_dim * (3.5 if backward else 1.0)
    if packed:
        from bench.attention import packed_segment_ids, visible_pairs

        segment_ids = packed_segment_ids(batch, seq).cuda()
        flops = 4.0 * heads * head_dim * visible_pairs(segment_ids) * (3.5 if backward else 1.0)

    def run():
        out = flash_attention(
            q, k, v, alibi_slopes=slopes, segment_ids=segment_ids, configs=configs
        )
        if backward:
            torch.autograd.grad(out, (q, k, v), grad_out)

    def timed():
        if packed:
            run()  # compiles outside the graph capture
            return do_bench_cudagraph(run, rep=100, return_mode="median")
        return do_bench(run, warmup=25, rep=100, return_mode="median")

    try:
        if backward:
            ms = timed()
        else:
            with torch.no_grad():
                ms = timed()
    except (
        Exception
    ) as error:  # a candidate that does not compile (e.g. out of shared memory) is skipped
        print(f"    failed: {type(error).__name__}: {str(error)[:200]}")
        return None
    return flops / ms / 1e9


def forget_compiled(kernel_name: str) -> None:
    """Empty the kernel's in-memory cache, so that what it holds after a candidate's run is that
    candidate's."""
    from pipeline.kernels import attention

    for kernel_cache, *_ in getattr(attention, kernel_name).device_caches.values():
        kernel_cache.clear()


def registers_and_spills(kernel_name: str) -> str:
    """Registers per thread and local-memory bytes of the kernel's variants compiled since
    `forget_compiled`."""
    from pipeline.kernels import attention

    found = [
        (compiled.n_regs, compiled.n_spills)
        for kernel_cache, *_ in getattr(attention, kernel_name).device_caches.values()
        for compiled in kernel_cache.values()
        if compiled.function is not None
    ]
    if not found:
        return "registers unknown"
    return f"{max(r for r, _ in found)} registers, {max(s for _, s in found)} bytes spilled"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        nargs="*",
        default=[f"{d}={','.join(map(str, s))}" for d, s in SHAPES.items()],
        help="head_dim=batch,heads,seq,head_dim[,kv_heads]",
    )
    for kernel, candidates in CANDIDATES.items():
        parser.add_argument(
            f"--{kernel.replace('_', '-')}", nargs="*", default=candidates, dest=kernel
        )
    parser.add_argument(
        "--packed",
        action="store_true",
        help="packed rows with document masks: time the "
        "candidates against the document-mask entry of the table",
    )
    args = parser.parse_args()
    arch = current_arch(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()} ({arch})")
    for spec in args.shape:
        shape = tuple(int(x) for x in spec.split("=")[1].split(","))
        table = attention_configs(arch, shape[3], has_segments=args.packed)
        print(f"shape {shape}, table: {table}")
        for kernel in CANDIDATES:
            for candidate in getattr(args, kernel):
                configs = dataclasses.replace(table, **{kernel: parse(candidate)})
                forget_compiled(KERNELS[kernel])
                tflops = time_candidate(
                    shape, configs, backward=kernel != "forward", packed=args.packed
                )
                if tflops is None:
                    continue
                print(
                    f"  {kernel:12s} {candidate:14s} {'fwd' if kernel == 'forward' else 'fwd+bwd'} "
                    f"{tflops:6.1f} TFLOP/s  ({registers_and_spills(KERNELS[kernel])})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
