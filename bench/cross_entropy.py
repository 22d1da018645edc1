"""Benchmark: the fused, chunked LM-head cross-entropy (Triton) against the unfused one, time and
peak memory.

hidden (tokens, d) and LM-head weight (vocab, d) in bf16; forward+backward (gradients of hidden and
weight).
- `ours`: pipeline.kernels.linear_cross_entropy (logits only chunk by chunk, gradients in the
  forward);
- `unfused fp32`: logits = hidden @ weight.T, then F.cross_entropy(logits.float()) (the reference);
- `unfused bf16`: F.cross_entropy on the bf16 logits directly;
- `unfused compiled`: torch.compile of `unfused fp32`. Peak memory is what forward+backward
  allocates above its inputs (the gradients it returns included). The table ends in the ratios of
  ours to the unfused fp32 one.

    python bench/cross_entropy.py
    python bench/cross_entropy.py --tokens 4096 --hidden 2048 --vocab 65536
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.kernels import linear_cross_entropy, reference  # noqa: E402


def unfused_bf16(hidden, weight, targets):
    return F.cross_entropy(hidden @ weight.t(), targets)


def measure(fn, hidden, weight, targets) -> tuple[float, float, float]:
    """(forward+backward ms, peak MiB above the inputs, loss)."""
    from triton.testing import do_bench

    def both():
        loss = fn(hidden, weight, targets)
        torch.autograd.grad(loss, (hidden, weight))
        return loss

    ms = do_bench(both, warmup=5, rep=50, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = both()
    torch.cuda.synchronize()
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/cross_entropy.py needs a GPU (CUDA or ROCm)")
    hidden = torch.randn(
        args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    weight = (
        torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16) / args.hidden**0.5
    )
    weight.requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), device="cuda")
    targets[::17] = -100  # some ignored tokens, as padding gives
    methods = {
        "ours": linear_cross_entropy,
        "unfused fp32": reference.linear_cross_entropy,
        "unfused bf16": unfused_bf16,
        "unfused compiled": torch.compile(reference.linear_cross_entropy),
    }
    results = {name: measure(fn, hidden, weight, targets) for name, fn in methods.items()}
    anchor_ms, anchor_mib, anchor_loss = results["unfused fp32"]
    lines = [
        f"tokens {args.tokens}, hidden {args.hidden}, vocab {args.vocab}, bf16; "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
        "",
        "| implementation | fwd+bwd ms | peak MiB | loss | time / unfused fp32 | peak / unfused "
        "fp32 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, (ms, mib, loss) in results.items():
        lines.append(
            f"| {name} | {ms:.2f} | {mib:.0f} | {loss:.4f} | {ms / anchor_ms:.2f} | "
            f"{mib / anchor_mib:.3f} |"
        )
    if abs(results["ours"][2] - anchor_loss) > 1e-2 * abs(anchor_loss):
        lines.append(
            f"\nWARNING: ours and the reference disagree on the loss ({results['ours'][2]} vs "
            f"{anchor_loss})"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
