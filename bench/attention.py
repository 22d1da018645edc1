"""Benchmark: our Triton ALiBi FlashAttention against FlexAttention with ALiBi, SDPA without bias
and SDPA with an ALiBi float mask, forward and forward+backward, bf16, causal, on one GPU; then
packed rows.

Dense rows, all at the same (batch, heads, seq, head_dim) and with the same per-head slopes:
- `ours`: pipeline.kernels.flash_attention with `alibi_slopes` (the Triton kernel);
- `flex+alibi`: torch's FlexAttention, compiled, with an ALiBi `score_mod` and a causal block mask;
- `sdpa (no bias)`: scaled_dot_product_attention(is_causal=True): FlashAttention without ALiBi, the
  ceiling;
- `sdpa+alibi mask`: scaled_dot_product_attention with an explicit (1, heads, seq, seq) float mask
  holding the ALiBi bias and -inf above the diagonal (what a model does without a fused ALiBi
  kernel). TFLOP/s count causal attention as 2*B*H*S^2*D for the forward and 3.5 times that for
  forward+backward.

Packed rows: each row holds documents of random lengths (exponential, mean 700 tokens, seeded; the
last one cut at the row's end), numbered 0, 1, ... as the packer does:
- `ours`: flash_attention with `alibi_slopes` and `segment_ids`;
- `flex+alibi+docs`: FlexAttention, compiled, with the ALiBi `score_mod` and a
  causal-and-same-document block mask (built once per case, outside the timing, as a model builds it
  once per batch);
- `sdpa dense`: scaled_dot_product_attention(is_causal=True) over the whole rows, no bias: the dense
  reference. Their TFLOP/s count the pairs that a document mask keeps (2 * 2 * D per pair, times 3.5
  for forward+backward), so `sdpa dense`'s figure is the time it spends, not its own FLOP rate.

Under CUDA graphs ours resolves its block ranges in every call (a model resolves them once per batch
for all its layers; `--profile` shows what those launches cost).

Dense times are medians of triton.testing.do_bench. Packed rows take a fraction of a millisecond,
where the host's launch overhead (Python, Triton's and torch.compile's launchers) can exceed the
GPU's work, so they are timed as CUDA-graph replays (triton.testing.do_bench_cudagraph, median): the
device time that a training step, whose host runs ahead of the GPU, pays. Before timing, the script
checks that ours and FlexAttention agree (bf16 outputs and gradients). Each table ends in the ratios
ours/flex and ours/sdpa (above 1: ours faster).

    python bench/attention.py                     # the five dense shapes of the issue and four packed cases
    python bench/attention.py --shapes 4,16,2048,128 --packed --out attention.md
    python bench/attention.py --shapes --profile  # packed cases, then a kernel profile and block statistics of each
    python bench/attention.py --stats-only        # block statistics of the packed cases (CPU; --arch picks tiles)

`--profile` runs torch.profiler over a few forward+backward iterations of ours and of FlexAttention
per case (eager, no CUDA graphs) and prints each kernel's calls, total and per-iteration device
time, its share, and for our kernels the TFLOP/s on the pairs the mask keeps (forward 4, dQ 6, dK/dV
8 FLOPs x D per pair: the matrix products each kernel runs). Block statistics (computed on the CPU
from the segment ids and the tiles of the launch table, `--arch`, default the GPU's or sm90): for
each kernel's tiling, the tiles of the causal triangle whose pairs are all masked, partly masked or
all visible, and the tiles each kernel runs without a mask or with one, those it runs that hold no
visible pair, and the pairs it computes per visible pair; the same for FlexAttention's 128 x 128
block mask (full blocks run without mask_mod, partial ones with it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.kernels import flash_attention  # noqa: E402
from pipeline.kernels.launch_configs import ATTENTION, attention_configs  # noqa: E402

SHAPES = [
    (4, 16, 2048, 128),
    (2, 16, 4096, 128),
    (1, 16, 8192, 128),
    (8, 32, 2048, 64),
    (2, 32, 4096, 64),
]
PACKED_SHAPES = [(4, 16, 2048, 128), (2, 16, 4096, 128), (8, 32, 2048, 64), (4, 32, 4096, 64)]
MEAN_DOCUMENT = 700
METHODS = ("ours", "flex+alibi", "sdpa (no bias)", "sdpa+alibi mask")
PACKED_METHODS = ("ours", "flex+alibi+docs", "sdpa dense")
FLEX_BLOCK = 128  # FlexAttention's BlockMask granularity (create_block_mask's default BLOCK_SIZE)


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes: a geometric sequence starting at 2^(-8/heads) (heads a power of two here)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])


def packed_segment_ids(
    batch: int, seq: int, seed: int = 0, mean: int = MEAN_DOCUMENT
) -> torch.Tensor:
    """(batch, seq) document ids 0, 1, ... per row, documents of exponential lengths with mean
    `mean`."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lengths = []
        while sum(lengths) < seq:
            lengths.append(
                max(1, int(torch.empty(1).exponential_(1.0 / mean, generator=generator)))
            )
        rows.append(
            torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:seq]
        )
    return torch.stack(rows)


def visible_pairs(segment_ids: torch.Tensor) -> int:
    """Query-key pairs a causal document mask keeps: L * (L + 1) / 2 per document."""
    total = 0
    for row in segment_ids:
        lengths = torch.unique_consecutive(row, return_counts=True)[1]
        total += int((lengths * (lengths + 1) // 2).sum())
    return total


def flex_methods(
    heads: int, seq: int, slopes: torch.Tensor, documents: torch.Tensor | None = None
) -> dict:
    """name -> f(q, k, v) for FlexAttention with ALiBi and a causal (and same-document) block mask,
    compiled."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def causal_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (documents[b, q_idx] == documents[b, kv_idx])

    # a fresh compile per shape, as a model of that shape gets (and no recompile limit)
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    if documents is None:
        block_mask = create_block_mask(causal, None, None, seq, seq, device="cuda")
        return {
            "flex+alibi": lambda q, k, v: flex(
                q, k, v, score_mod=alibi_score, block_mask=block_mask
            )
        }
    block_mask = create_block_mask(
        causal_document, documents.shape[0], None, seq, seq, device="cuda"
    )
    return {
        "flex+alibi+docs": lambda q, k, v: flex(
            q, k, v, score_mod=alibi_score, block_mask=block_mask
        )
    }


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_against_flex(methods: dict, flex_name: str, q, k, v, grad_out, case) -> float:
    """Ours must compute what FlexAttention computes, or its speed means nothing: max relative
    error."""
    outputs = {}
    for name in ("ours", flex_name):
        out = methods[name](q, k, v)
        outputs[name] = (out, *torch.autograd.grad(out, (q, k, v), grad_out))
    errors = [relative_error(a, b) for a, b in zip(outputs["ours"], outputs[flex_name])]
    if max(errors) > 2e-2:
        raise SystemExit(
            f"ours and FlexAttention disagree at {case}: relative errors (out, dq, dk, dv) {errors}"
        )
    return max(errors)


def time_forward_and_backward(
    attend, q, k, v, grad_out, cuda_graph: bool = False
) -> tuple[float, float]:
    """Median milliseconds of the forward (no autograd) and of forward+backward; replayed as CUDA
    graphs if asked."""
    from triton.testing import do_bench, do_bench_cudagraph

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward():
        torch.autograd.grad(attend(q, k, v), (q, k, v), grad_out)

    if cuda_graph:
        return tuple(
            do_bench_cudagraph(fn, rep=50, return_mode="median")
            for fn in (forward, forward_backward)
        )
    return tuple(
        do_bench(fn, warmup=25, rep=200, return_mode="median") for fn in (forward, forward_backward)
    )


def bench_shape(
    batch: int, heads: int, seq: int, head_dim: int, profile_iterations: int = 0
) -> dict:
    slopes = alibi_slopes(heads).cuda()
    positions = torch.arange(seq, device="cuda")
    distance = (positions[None, :] - positions[:, None]).float()
    mask = (slopes.view(heads, 1, 1) * distance).masked_fill(distance > 0, float("-inf"))
    mask = mask.to(torch.bfloat16).unsqueeze(0)
    methods = {
        "ours": lambda q, k, v: flash_attention(q, k, v, causal=True, alibi_slopes=slopes),
        **flex_methods(heads, seq, slopes),
        "sdpa (no bias)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa+alibi mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }
    q, k, v = (
        torch.randn(
            batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True
        )
        for _ in range(3)
    )
    grad_out = torch.randn_like(q)
    row = {
        "shape": (batch, heads, seq, head_dim),
        "max_rel_err_vs_flex": check_against_flex(
            methods, "flex+alibi", q, k, v, grad_out, (batch, heads, seq, head_dim)
        ),
    }
    flops = 2.0 * batch * heads * seq * seq * head_dim
    for name, attend in methods.items():
        forward_ms, both_ms = time_forward_and_backward(attend, q, k, v, grad_out)
        row[name] = (flops / forward_ms / 1e9, 3.5 * flops / both_ms / 1e9)
    if profile_iterations:
        row["profile"] = profile_methods(
            methods, ("ours", "flex+alibi"), None, q, k, v, grad_out, profile_iterations, ""
        )
    return row


def packed_methods(heads: int, seq: int, slopes: torch.Tensor, documents: torch.Tensor) -> dict:
    """name -> f(q, k, v) of the packed-rows methods."""
    return {
        "ours": lambda q, k, v: flash_attention(
            q, k, v, causal=True, alibi_slopes=slopes, segment_ids=documents
        ),
        **flex_methods(heads, seq, slopes, documents),
        "sdpa dense": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }


def bench_packed(
    batch: int, heads: int, seq: int, head_dim: int, profile_iterations: int = 0, arch: str = "sm90"
) -> dict:
    slopes = alibi_slopes(heads).cuda()
    documents = packed_segment_ids(batch, seq).cuda()
    methods = packed_methods(heads, seq, slopes, documents)
    q, k, v = (
        torch.randn(
            batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True
        )
        for _ in range(3)
    )
    grad_out = torch.randn_like(q)
    case = (batch, heads, seq, head_dim)
    row = {
        "shape": case,
        "documents": int(documents.max(1).values.sum() + batch),
        "max_rel_err_vs_flex": check_against_flex(
            methods, "flex+alibi+docs", q, k, v, grad_out, case
        ),
    }
    flops = 4.0 * heads * head_dim * visible_pairs(documents)
    for name, attend in methods.items():
        forward_ms, both_ms = time_forward_and_backward(attend, q, k, v, grad_out, cuda_graph=True)
        row[name] = (flops / forward_ms / 1e9, 3.5 * flops / both_ms / 1e9, forward_ms, both_ms)
    if profile_iterations:
        row["profile"] = profile_methods(
            methods,
            ("ours", "flex+alibi+docs"),
            documents,
            q,
            k,
            v,
            grad_out,
            profile_iterations,
            arch,
        )
    return row


def table(rows: list[dict]) -> str:
    header = (
        "| B,H,S,D | "
        + " | ".join(f"{m} fwd | {m} fwd+bwd" for m in METHODS)
        + " | ours/flex fwd | ours/flex fwd+bwd | ours/sdpa fwd | ours/sdpa fwd+bwd |"
    )
    lines = [header, "|" + "---|" * (1 + 2 * len(METHODS) + 4)]
    for row in rows:
        cells = [",".join(map(str, row["shape"]))]
        cells += [f"{row[m][i]:.0f}" for m in METHODS for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['flex+alibi'][i]:.2f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['sdpa (no bias)'][i]:.2f}" for i in (0, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def packed_table(rows: list[dict]) -> str:
    header = (
        "| B,H,S,D | documents | "
        + " | ".join(f"{m} fwd ms | {m} fwd+bwd ms" for m in PACKED_METHODS)
        + " | ours TFLOP/s fwd | ours TFLOP/s fwd+bwd | ours/flex fwd | ours/flex fwd+bwd | "
        "ours/sdpa dense fwd"
        " | ours/sdpa dense fwd+bwd |"
    )
    lines = [header, "|" + "---|" * (2 + 2 * len(PACKED_METHODS) + 6)]
    for row in rows:
        cells = [",".join(map(str, row["shape"])), str(row["documents"])]
        cells += [f"{row[m][i]:.3f}" for m in PACKED_METHODS for i in (2, 3)]
        cells += [f"{row['ours'][i]:.0f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['flex+alibi+docs'][i]:.2f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['sdpa dense'][i]:.2f}" for i in (0, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Block statistics of packed rows: CPU only, from the segment ids and the tile sizes.


def visible_per_tile(
    segment_ids: torch.Tensor, block_q: int, block_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, query tiles, key tiles) counts of the pairs a causal document mask keeps, and of all
    pairs (the tile's area inside the sequence)."""
    batch, seq = segment_ids.shape
    n_q, n_k = -(-seq // block_q), -(-seq // block_k)
    positions = torch.arange(seq)
    counts = []
    for ids in segment_ids.cpu():
        keep = (ids[:, None] == ids[None, :]) & (positions[:, None] >= positions[None, :])
        keep = F.pad(keep, (0, n_k * block_k - seq, 0, n_q * block_q - seq))
        counts.append(keep.view(n_q, block_q, n_k, block_k).sum((1, 3)))
    rows = torch.clamp(seq - torch.arange(n_q) * block_q, max=block_q)
    cols = torch.clamp(seq - torch.arange(n_k) * block_k, max=block_k)
    return torch.stack(counts), (rows[:, None] * cols[None, :]).expand(batch, n_q, n_k)


def block_ranges(ids: torch.Tensor, outer: int, inner: int) -> torch.Tensor:
    """(outer blocks, 4) [lo, full_lo, full_hi, hi] in inner blocks, as
    pipeline/kernels/attention.py's `_segment_block_ranges` resolves them for one row."""
    seq = len(ids)

    def bounds(width):
        n = -(-seq // width)
        padded = F.pad(ids, (0, n * width - seq), value=0).view(n, width)
        valid = F.pad(torch.ones(seq, dtype=torch.bool), (0, n * width - seq)).view(n, width)
        big = torch.iinfo(ids.dtype).max
        low = torch.where(valid, padded, big).min(1).values
        high = torch.where(valid, padded, -big).max(1).values
        return low, high, valid.all(1)

    out_lo, out_hi, _ = bounds(outer)
    in_lo, in_hi, whole = bounds(inner)
    seen = (in_hi[None, :] >= out_lo[:, None]) & (in_lo[None, :] <= out_hi[:, None])
    full = (
        seen
        & whole[None, :]
        & (in_lo == in_hi)[None, :]
        & (in_lo[None, :] == out_lo[:, None])
        & (out_lo == out_hi)[:, None]
    )
    index = torch.arange(len(in_lo))
    result = []
    for o in range(len(out_lo)):
        visible, unmasked = index[seen[o]], index[full[o]]
        lo, hi = int(visible[0]), int(visible[-1]) + 1
        one_run = len(unmasked) > 0 and len(unmasked) == int(unmasked[-1]) - int(unmasked[0]) + 1
        full_lo, full_hi = (int(unmasked[0]), int(unmasked[-1]) + 1) if one_run else (lo, lo)
        result.append((lo, full_lo, full_hi, hi))
    return torch.tensor(result)


def kernel_tiles(
    segment_ids: torch.Tensor, block_m: int, block_n: int, queries_outer: bool
) -> dict:
    """The tile pairs (block_m queries x block_n keys) a causal document-mask kernel of ours runs,
    by whether it masks them (per score): the forward and dQ kernels (queries_outer) run their range
    of keys before the diagonal with its full run unmasked and its ends and the diagonal masked; the
    dK/dV kernel runs the diagonal and its range of queries after it as one masked loop."""
    counts, area = visible_per_tile(segment_ids, block_m, block_n)
    run = {"unmasked": 0, "masked": 0}
    empty = computed = 0
    seq = segment_ids.shape[1]
    for row, ids in enumerate(segment_ids.cpu()):
        outer, inner = (block_m, block_n) if queries_outer else (block_n, block_m)
        for block, (lo, full_lo, full_hi, hi) in enumerate(
            block_ranges(ids, outer, inner).tolist()
        ):
            anchor = block * outer
            diagonal = range(anchor // inner, -(-min(anchor + outer, seq) // inner))
            region = (0, anchor // inner) if queries_outer else (diagonal.stop, -(-seq // inner))
            lo, full_lo, full_hi, hi = (
                min(max(x, region[0]), region[1]) for x in (lo, full_lo, full_hi, hi)
            )
            if queries_outer:
                kinds = [
                    ("masked", range(lo, full_lo)),
                    ("unmasked", range(full_lo, full_hi)),
                    ("masked", range(full_hi, hi)),
                    ("masked", diagonal),
                ]
            else:
                kinds = [("masked", range(diagonal.start, max(hi, diagonal.stop)))]
            for kind, inners in kinds:
                for other in inners:
                    q_tile, k_tile = (block, other) if queries_outer else (other, block)
                    run[kind] += 1
                    empty += int(counts[row, q_tile, k_tile] == 0)
                    computed += int(area[row, q_tile, k_tile])
    return {**run, "run, no visible pair": empty, "computed pairs": computed}


def tile_classes(segment_ids: torch.Tensor, block_q: int, block_k: int) -> dict:
    """Tiles of the causal triangle (a tile with any query at or after a key) whose pairs the mask
    keeps: none, some or all."""
    counts, area = visible_per_tile(segment_ids, block_q, block_k)
    q_last = (
        torch.clamp((torch.arange(counts.shape[1]) + 1) * block_q, max=segment_ids.shape[1]) - 1
    )
    triangle = (q_last[:, None] >= torch.arange(counts.shape[2])[None, :] * block_k).expand_as(
        counts
    )
    return {
        "causal tiles": int(triangle.sum()),
        "all masked": int((triangle & (counts == 0)).sum()),
        "partly masked": int((triangle & (counts > 0) & (counts < area)).sum()),
        "all visible": int((triangle & (counts == area)).sum()),
    }


def block_statistics(segment_ids: torch.Tensor, arch: str, head_dim: int) -> str:
    """A markdown table of the tiles of each kernel of ours (launch table of `arch`) and of
    FlexAttention's block mask, for these rows; shares in percent of the causal tiles at that
    tiling."""
    configs = attention_configs(arch, head_dim, has_segments=True)
    pairs = visible_pairs(segment_ids)
    lines = [
        "| kernel | tile (q x k) | causal tiles | all masked % | partly masked % | all visible % | "
        "run unmasked % "
        "| run masked % | run with no visible pair % | computed / visible pairs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def line(name, block_q, block_k, run):
        classes = tile_classes(segment_ids, block_q, block_k)
        total = classes["causal tiles"]
        share = lambda n: f"{100 * n / total:.1f}"
        lines.append(
            f"| {name} | {block_q} x {block_k} | {total} | {share(classes['all masked'])} | "
            f"{share(classes['partly masked'])} | {share(classes['all visible'])} | "
            f"{share(run['unmasked'])} | {share(run['masked'])} | "
            f"{share(run['run, no visible pair'])} | {run['computed pairs'] / pairs:.2f} |"
        )

    for name, config, queries_outer in (
        ("ours forward", configs.forward, True),
        ("ours dQ", configs.backward_q, True),
        ("ours dK/dV", configs.backward_kv, False),
    ):
        line(
            name,
            config.block_m,
            config.block_n,
            kernel_tiles(segment_ids, config.block_m, config.block_n, queries_outer),
        )
    flex = tile_classes(segment_ids, FLEX_BLOCK, FLEX_BLOCK)
    counts, area = visible_per_tile(segment_ids, FLEX_BLOCK, FLEX_BLOCK)
    line(
        "flex block mask",
        FLEX_BLOCK,
        FLEX_BLOCK,
        {
            "unmasked": flex["all visible"],
            "masked": flex["partly masked"],
            "run, no visible pair": 0,
            "computed pairs": int(area[counts > 0].sum()),
        },
    )
    return "\n".join(lines)


def device_time_us(event) -> float:
    """A profiler average's own device time (microseconds), across torch versions."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


# FLOPs per visible pair and head dim of our kernels' matrix products: QK^T and PV; QK^T, dO V^T and
# dS K; QK^T, P^T dO, V dO^T and dS^T Q.
OUR_KERNEL_FLOPS = {
    "_attention_forward": 4,
    "_attention_backward_q": 6,
    "_attention_backward_kv": 8,
}


def profile_methods(
    methods: dict,
    names: tuple,
    documents: torch.Tensor | None,
    q,
    k,
    v,
    grad_out,
    iterations: int,
    arch: str,
) -> str:
    """Per-kernel device time of `names` over `iterations` forward+backward passes, and for packed
    rows (`documents`) the block statistics of the rows."""
    from torch.profiler import ProfilerActivity, profile

    from pipeline.kernels import attention as triton_module

    batch, heads, seq, head_dim = q.shape
    pairs = heads * (
        visible_pairs(documents) if documents is not None else batch * seq * (seq + 1) // 2
    )
    case = ",".join(map(str, (batch, heads, seq, head_dim)))
    kind = "packed" if documents is not None else "dense"
    text = [f"\n#### Profile, {kind} {case} ({iterations} forward+backward iterations, eager)\n"]
    for name in names:
        attend = methods[name]

        def step():
            # As under the CUDA graphs of the timing: block ranges resolved in every call (a model:
            # once per batch).
            triton_module._DOCUMENT_BLOCKS.clear()
            torch.autograd.grad(attend(q, k, v), (q, k, v), grad_out)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iterations):
                step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if device_time_us(e) > 0]
        kernels.sort(key=device_time_us, reverse=True)
        total = sum(device_time_us(e) for e in kernels)
        if total == 0:
            text.append(f"{name}: the profiler recorded no kernel\n")
            continue
        lines = [
            f"{name}: {total / iterations / 1000:.3f} ms of kernels per forward+backward, "
            f"{3.5 * 4 * head_dim * pairs / (total / iterations) / 1e6:.0f} TFLOP/s on the visible "
            "pairs",
            "",
            "| kernel | calls | total ms | us per iteration | share % | TFLOP/s (visible pairs) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        ranges_us = 0.0
        for event in kernels:
            us = device_time_us(event)
            flops = OUR_KERNEL_FLOPS.get(event.key)
            rate = f"{flops * head_dim * pairs * event.count / us / 1e6:.0f}" if flops else ""
            if event.key == "_segment_block_ranges":
                ranges_us = us
            lines.append(
                f"| {event.key[:90]} | {event.count} | {us / 1000:.3f} | {us / iterations:.1f} | "
                f"{100 * us / total:.1f} | {rate} |"
            )
        if ranges_us:
            lines.append(
                f"\n{name} without its block-range launches (a model's layers share them): "
                f"{(total - ranges_us) / iterations / 1000:.3f} ms per forward+backward"
            )
        text.append("\n".join(lines) + "\n")
    if documents is not None:
        text.append(
            f"Block statistics ({arch} tiles, D={head_dim}):\n\n"
            f"{block_statistics(documents.cpu(), arch, head_dim)}\n"
        )
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        nargs="*",
        default=[",".join(map(str, s)) for s in SHAPES],
        help="batch,heads,seq,head_dim of each dense case (none: skip them)",
    )
    parser.add_argument(
        "--packed",
        nargs="*",
        default=[",".join(map(str, s)) for s in PACKED_SHAPES],
        help="batch,heads,seq,head_dim of each packed-rows case (none: skip them)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing each case, profile ours and "
        "FlexAttention per kernel (torch.profiler); for packed cases also the block statistics",
    )
    parser.add_argument(
        "--profile-iterations", type=int, default=5, help="forward+backward passes per profile"
    )
    parser.add_argument(
        "--stats-only",
        action="store_true",
        help="print the block statistics of the packed cases and exit (no GPU needed)",
    )
    parser.add_argument(
        "--arch",
        choices=sorted(ATTENTION),
        help="launch table whose tiles the block statistics "
        "use (default: this GPU's, or sm90 without one)",
    )
    parser.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    args = parser.parse_args()
    cases = {
        "dense": [tuple(int(x) for x in spec.split(",")) for spec in args.shapes],
        "packed": [tuple(int(x) for x in spec.split(",")) for spec in args.packed],
    }
    for kind, shapes in cases.items():
        for shape in shapes:
            if len(shape) != 4:
                raise SystemExit(f"a {kind} case is batch,heads,seq,head_dim; got {shape}")
    arch = args.arch
    if arch is None:
        from pipeline.kernels.launch_configs import current_arch

        arch = current_arch(torch.device("cuda")) if torch.cuda.is_available() else "sm90"
    if args.stats_only:
        for batch, heads, seq, head_dim in cases["packed"]:
            documents = packed_segment_ids(batch, seq)
            print(
                f"\nPacked {batch},{heads},{seq},{head_dim}: "
                f"{int(documents.max(1).values.sum()) + batch} "
                f"documents, {visible_pairs(documents) / (batch * seq * (seq + 1) / 2):.1%} of the "
                "causal pairs "
                f"visible; {arch} tiles, "
                f"D={head_dim}:\n\n{block_statistics(documents, arch, head_dim)}",
                flush=True,
            )
        return
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench/attention.py needs a GPU (CUDA or ROCm); --stats-only runs on a CPU"
        )
    rows, packed_rows = [], []
    for shape in cases["dense"]:
        started = time.perf_counter()
        row = bench_shape(*shape, profile_iterations=args.profile_iterations if args.profile else 0)
        print(
            f"{row['shape']}: "
            + ", ".join(f"{m} {row[m][0]:.0f}/{row[m][1]:.0f}" for m in METHODS)
            + f" TFLOP/s (fwd/fwd+bwd); max rel err vs flex {row['max_rel_err_vs_flex']:.1e} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if "profile" in row:
            print(row["profile"], flush=True)
        rows.append(row)
    for shape in cases["packed"]:
        started = time.perf_counter()
        row = bench_packed(
            *shape, profile_iterations=args.profile_iterations if args.profile else 0, arch=arch
        )
        print(
            f"packed {row['shape']}, {row['documents']} documents: "
            + ", ".join(f"{m} {row[m][2]:.3f}/{row[m][3]:.3f}" for m in PACKED_METHODS)
            + f" ms (fwd/fwd+bwd); max rel err vs flex {row['max_rel_err_vs_flex']:.1e} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if "profile" in row:
            print(row["profile"], flush=True)
        packed_rows.append(row)
    text = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{__import__('triton').__version__}; bf16, causal\n"
    )
    if rows:
        text += f"\nDense rows, TFLOP/s:\n\n{table(rows)}\n"
    if packed_rows:
        text += (
            f"\nPacked rows (documents of mean {MEAN_DOCUMENT} tokens), milliseconds of CUDA-graph "
            "replays; "
            f"TFLOP/s count the pairs the document mask keeps:\n\n{packed_table(packed_rows)}\n"
        )
    text += "".join(row.get("profile", "") for row in rows + packed_rows)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
