"""Benchmark: our Triton ALiBi FlashAttention against FlexAttention with ALiBi, SDPA without bias and SDPA
with an ALiBi float mask, forward and forward+backward, bf16, causal, on one GPU.

Compared, all at the same (batch, heads, seq, head_dim) and with the same per-head slopes:
- `ours`: pipeline.kernels.flash_attention with `alibi_slopes` (the Triton kernel);
- `flex+alibi`: torch's FlexAttention, compiled, with an ALiBi `score_mod` and a causal block mask;
- `sdpa (no bias)`: scaled_dot_product_attention(is_causal=True): FlashAttention without ALiBi, the ceiling;
- `sdpa+alibi mask`: scaled_dot_product_attention with an explicit (1, heads, seq, seq) float mask holding the
  ALiBi bias and -inf above the diagonal (what a model does without a fused ALiBi kernel).
TFLOP/s count causal attention as 2*B*H*S^2*D for the forward and 3.5 times that for forward+backward;
each time is the median of triton.testing.do_bench. Before timing, the script checks that ours and
FlexAttention agree (bf16 outputs and gradients). The table ends in the ratios ours/flex and ours/sdpa.

    python bench/attention.py                     # the five shapes of the issue
    python bench/attention.py --shapes 4,16,2048,128 --out attention.md
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
METHODS = ("ours", "flex+alibi", "sdpa (no bias)", "sdpa+alibi mask")


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes: a geometric sequence starting at 2^(-8/heads) (heads a power of two here)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])


def attention_methods(heads: int, seq: int, slopes: torch.Tensor) -> dict:
    """name -> f(q, k, v) for every compared implementation, set up for this head count and length."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    torch._dynamo.reset()  # a fresh compile per shape, as a model of that shape gets (and no recompile limit)
    block_mask = create_block_mask(causal, None, None, seq, seq, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    positions = torch.arange(seq, device="cuda")
    distance = (positions[None, :] - positions[:, None]).float()
    mask = (slopes.view(heads, 1, 1) * distance).masked_fill(distance > 0, float("-inf"))
    mask = mask.to(torch.bfloat16).unsqueeze(0)
    return {
        "ours": lambda q, k, v: flash_attention(q, k, v, causal=True, alibi_slopes=slopes),
        "flex+alibi": lambda q, k, v: flex(q, k, v, score_mod=alibi_score, block_mask=block_mask),
        "sdpa (no bias)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa+alibi mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench_shape(batch: int, heads: int, seq: int, head_dim: int) -> dict:
    from triton.testing import do_bench

    slopes = alibi_slopes(heads).cuda()
    methods = attention_methods(heads, seq, slopes)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn_like(q)

    # ours must compute what FlexAttention computes, or its speed means nothing
    outputs = {}
    for name in ("ours", "flex+alibi"):
        out = methods[name](q, k, v)
        outputs[name] = (out, *torch.autograd.grad(out, (q, k, v), grad_out))
    errors = [relative_error(a, b) for a, b in zip(outputs["ours"], outputs["flex+alibi"])]
    if max(errors) > 2e-2:
        raise SystemExit(f"ours and FlexAttention disagree at {(batch, heads, seq, head_dim)}: relative errors "
                         f"(out, dq, dk, dv) {errors}")
    del outputs

    flops = 2.0 * batch * heads * seq * seq * head_dim
    row = {"shape": (batch, heads, seq, head_dim), "max_rel_err_vs_flex": max(errors)}
    for name, attend in methods.items():
        with torch.no_grad():
            forward_ms = do_bench(lambda: attend(q, k, v), warmup=25, rep=200, return_mode="median")

        def forward_backward():
            torch.autograd.grad(attend(q, k, v), (q, k, v), grad_out)

        both_ms = do_bench(forward_backward, warmup=25, rep=200, return_mode="median")
        row[name] = (flops / forward_ms / 1e9, 3.5 * flops / both_ms / 1e9)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES],
                        help="batch,heads,seq,head_dim of each case")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention.py needs a GPU (CUDA or ROCm)")
    rows = []
    for spec in args.shapes:
        row = bench_shape(*(int(x) for x in spec.split(",")))
        print(f"{row['shape']}: " + ", ".join(f"{m} {row[m][0]:.0f}/{row[m][1]:.0f}" for m in METHODS)
              + f" TFLOP/s (fwd/fwd+bwd); max rel err vs flex {row['max_rel_err_vs_flex']:.1e}", flush=True)
        rows.append(row)
    text = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{__import__('triton').__version__}; TFLOP/s, bf16, causal\n\n{table(rows)}\n")
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
