"""Benchmark: our Triton ALiBi FlashAttention against FlexAttention with ALiBi, SDPA without bias and SDPA
with an ALiBi float mask, forward and forward+backward, bf16, causal, on one GPU; then packed rows.

Dense rows, all at the same (batch, heads, seq, head_dim) and with the same per-head slopes:
- `ours`: pipeline.kernels.flash_attention with `alibi_slopes` (the Triton kernel);
- `flex+alibi`: torch's FlexAttention, compiled, with an ALiBi `score_mod` and a causal block mask;
- `sdpa (no bias)`: scaled_dot_product_attention(is_causal=True): FlashAttention without ALiBi, the ceiling;
- `sdpa+alibi mask`: scaled_dot_product_attention with an explicit (1, heads, seq, seq) float mask holding the
  ALiBi bias and -inf above the diagonal (what a model does without a fused ALiBi kernel).
TFLOP/s count causal attention as 2*B*H*S^2*D for the forward and 3.5 times that for forward+backward.

Packed rows: each row holds documents of random lengths (exponential, mean 700 tokens, seeded; the last one cut
at the row's end), numbered 0, 1, ... as the packer does:
- `ours`: flash_attention with `alibi_slopes` and `segment_ids`;
- `flex+alibi+docs`: FlexAttention, compiled, with the ALiBi `score_mod` and a causal-and-same-document block mask
  (built once per case, outside the timing, as a model builds it once per batch);
- `sdpa dense`: scaled_dot_product_attention(is_causal=True) over the whole rows, no bias: the dense reference.
Their TFLOP/s count the pairs that a document mask keeps (2 * 2 * D per pair, times 3.5 for forward+backward), so
`sdpa dense`'s figure is the time it spends, not its own FLOP rate.

Dense times are medians of triton.testing.do_bench. Packed rows take a fraction of a millisecond, where the host's
launch overhead (Python, Triton's and torch.compile's launchers) can exceed the GPU's work, so they are timed as
CUDA-graph replays (triton.testing.do_bench_cudagraph, median): the device time that a training step, whose host
runs ahead of the GPU, pays. Before timing, the script checks that ours and FlexAttention agree (bf16 outputs and
gradients). Each table ends in the ratios ours/flex and ours/sdpa (above 1: ours faster).

    python bench/attention.py                     # the five dense shapes of the issue and four packed cases
    python bench/attention.py --shapes 4,16,2048,128 --packed --out attention.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.kernels import flash_attention  # noqa: E402

SHAPES = [(4, 16, 2048, 128), (2, 16, 4096, 128), (1, 16, 8192, 128), (8, 32, 2048, 64), (2, 32, 4096, 64)]
PACKED_SHAPES = [(4, 16, 2048, 128), (2, 16, 4096, 128), (8, 32, 2048, 64), (4, 32, 4096, 64)]
MEAN_DOCUMENT = 700
METHODS = ("ours", "flex+alibi", "sdpa (no bias)", "sdpa+alibi mask")
PACKED_METHODS = ("ours", "flex+alibi+docs", "sdpa dense")


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes: a geometric sequence starting at 2^(-8/heads) (heads a power of two here)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])


def packed_segment_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """(batch, seq) document ids 0, 1, ... per row, documents of exponential lengths with mean MEAN_DOCUMENT."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lengths = []
        while sum(lengths) < seq:
            lengths.append(max(1, int(torch.empty(1).exponential_(1.0 / MEAN_DOCUMENT, generator=generator))))
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:seq])
    return torch.stack(rows)


def visible_pairs(segment_ids: torch.Tensor) -> int:
    """Query-key pairs a causal document mask keeps: L * (L + 1) / 2 per document."""
    total = 0
    for row in segment_ids:
        lengths = torch.unique_consecutive(row, return_counts=True)[1]
        total += int((lengths * (lengths + 1) // 2).sum())
    return total


def flex_methods(heads: int, seq: int, slopes: torch.Tensor, documents: torch.Tensor | None = None) -> dict:
    """name -> f(q, k, v) for FlexAttention with ALiBi and a causal (and same-document) block mask, compiled."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def causal_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (documents[b, q_idx] == documents[b, kv_idx])

    torch._dynamo.reset()  # a fresh compile per shape, as a model of that shape gets (and no recompile limit)
    flex = torch.compile(flex_attention, dynamic=False)
    if documents is None:
        block_mask = create_block_mask(causal, None, None, seq, seq, device="cuda")
        return {"flex+alibi": lambda q, k, v: flex(q, k, v, score_mod=alibi_score, block_mask=block_mask)}
    block_mask = create_block_mask(causal_document, documents.shape[0], None, seq, seq, device="cuda")
    return {"flex+alibi+docs": lambda q, k, v: flex(q, k, v, score_mod=alibi_score, block_mask=block_mask)}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_against_flex(methods: dict, flex_name: str, q, k, v, grad_out, case) -> float:
    """Ours must compute what FlexAttention computes, or its speed means nothing: max relative error."""
    outputs = {}
    for name in ("ours", flex_name):
        out = methods[name](q, k, v)
        outputs[name] = (out, *torch.autograd.grad(out, (q, k, v), grad_out))
    errors = [relative_error(a, b) for a, b in zip(outputs["ours"], outputs[flex_name])]
    if max(errors) > 2e-2:
        raise SystemExit(f"ours and FlexAttention disagree at {case}: relative errors (out, dq, dk, dv) {errors}")
    return max(errors)


def time_forward_and_backward(attend, q, k, v, grad_out, cuda_graph: bool = False) -> tuple[float, float]:
    """Median milliseconds of the forward (no autograd) and of forward+backward; replayed as CUDA graphs if asked."""
    from triton.testing import do_bench, do_bench_cudagraph

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward():
        torch.autograd.grad(attend(q, k, v), (q, k, v), grad_out)

    if cuda_graph:
        return tuple(do_bench_cudagraph(fn, rep=50, return_mode="median") for fn in (forward, forward_backward))
    return tuple(do_bench(fn, warmup=25, rep=200, return_mode="median") for fn in (forward, forward_backward))


def bench_shape(batch: int, heads: int, seq: int, head_dim: int) -> dict:
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
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn_like(q)
    row = {"shape": (batch, heads, seq, head_dim),
           "max_rel_err_vs_flex": check_against_flex(methods, "flex+alibi", q, k, v, grad_out, (batch, heads, seq,
                                                                                                  head_dim))}
    flops = 2.0 * batch * heads * seq * seq * head_dim
    for name, attend in methods.items():
        forward_ms, both_ms = time_forward_and_backward(attend, q, k, v, grad_out)
        row[name] = (flops / forward_ms / 1e9, 3.5 * flops / both_ms / 1e9)
    return row


def bench_packed(batch: int, heads: int, seq: int, head_dim: int) -> dict:
    slopes = alibi_slopes(heads).cuda()
    documents = packed_segment_ids(batch, seq).cuda()
    methods = {
        "ours": lambda q, k, v: flash_attention(q, k, v, causal=True, alibi_slopes=slopes, segment_ids=documents),
        **flex_methods(heads, seq, slopes, documents),
        "sdpa dense": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn_like(q)
    case = (batch, heads, seq, head_dim)
    row = {"shape": case, "documents": int(documents.max(1).values.sum() + batch),
           "max_rel_err_vs_flex": check_against_flex(methods, "flex+alibi+docs", q, k, v, grad_out, case)}
    flops = 4.0 * heads * head_dim * visible_pairs(documents)
    for name, attend in methods.items():
        forward_ms, both_ms = time_forward_and_backward(attend, q, k, v, grad_out, cuda_graph=True)
        row[name] = (flops / forward_ms / 1e9, 3.5 * flops / both_ms / 1e9, forward_ms, both_ms)
    return row


def table(rows: list[dict]) -> str:
    header = ("| B,H,S,D | " + " | ".join(f"{m} fwd | {m} fwd+bwd" for m in METHODS)
              + " | ours/flex fwd | ours/flex fwd+bwd | ours/sdpa fwd | ours/sdpa fwd+bwd |")
    lines = [header, "|" + "---|" * (1 + 2 * len(METHODS) + 4)]
    for row in rows:
        cells = [",".join(map(str, row["shape"]))]
        cells += [f"{row[m][i]:.0f}" for m in METHODS for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['flex+alibi'][i]:.2f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['sdpa (no bias)'][i]:.2f}" for i in (0, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def packed_table(rows: list[dict]) -> str:
    header = ("| B,H,S,D | documents | " + " | ".join(f"{m} fwd ms | {m} fwd+bwd ms" for m in PACKED_METHODS)
              + " | ours TFLOP/s fwd | ours TFLOP/s fwd+bwd | ours/flex fwd | ours/flex fwd+bwd | ours/sdpa dense fwd"
                " | ours/sdpa dense fwd+bwd |")
    lines = [header, "|" + "---|" * (2 + 2 * len(PACKED_METHODS) + 6)]
    for row in rows:
        cells = [",".join(map(str, row["shape"])), str(row["documents"])]
        cells += [f"{row[m][i]:.3f}" for m in PACKED_METHODS for i in (2, 3)]
        cells += [f"{row['ours'][i]:.0f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['flex+alibi+docs'][i]:.2f}" for i in (0, 1)]
        cells += [f"{row['ours'][i] / row['sdpa dense'][i]:.2f}" for i in (0, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES],
                        help="batch,heads,seq,head_dim of each dense case (none: skip them)")
    parser.add_argument("--packed", nargs="*", default=[",".join(map(str, s)) for s in PACKED_SHAPES],
                        help="batch,heads,seq,head_dim of each packed-rows case (none: skip them)")
    parser.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention.py needs a GPU (CUDA or ROCm)")
    rows, packed_rows = [], []
    for spec in args.shapes:
        row = bench_shape(*(int(x) for x in spec.split(",")))
        print(f"{row['shape']}: " + ", ".join(f"{m} {row[m][0]:.0f}/{row[m][1]:.0f}" for m in METHODS)
              + f" TFLOP/s (fwd/fwd+bwd); max rel err vs flex {row['max_rel_err_vs_flex']:.1e}", flush=True)
        rows.append(row)
    for spec in args.packed:
        row = bench_packed(*(int(x) for x in spec.split(",")))
        print(f"packed {row['shape']}, {row['documents']} documents: "
              + ", ".join(f"{m} {row[m][2]:.3f}/{row[m][3]:.3f}" for m in PACKED_METHODS)
              + f" ms (fwd/fwd+bwd); max rel err vs flex {row['max_rel_err_vs_flex']:.1e}", flush=True)
        packed_rows.append(row)
    text = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{__import__('triton').__version__}; bf16, causal\n")
    if rows:
        text += f"\nDense rows, TFLOP/s:\n\n{table(rows)}\n"
    if packed_rows:
        text += (f"\nPacked rows (documents of mean {MEAN_DOCUMENT} tokens), milliseconds of CUDA-graph replays; "
                 f"TFLOP/s count the pairs the document mask keeps:\n\n{packed_table(packed_rows)}\n")
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
