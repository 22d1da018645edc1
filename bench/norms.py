"""Benchmark: fused RMSNorm and LayerNorm (Triton) against the PyTorch reference, its torch.compile,
and torch's own.

bf16 activations (tokens, hidden) with a bf16 weight (and bias); forward, and forward+backward
(gradients of input, weight, bias), as the median of triton.testing.do_bench, plus the peak memory
that forward+backward allocates above its inputs. A norm of 8192 rows takes tens of microseconds on
the GPU, less than the host may take to launch it (Python, autograd, launchers), so forward+backward
is also timed as CUDA-graph replays (do_bench_cudagraph): the device time, which is what a training
step pays when its host runs ahead of the GPU. The table ends in the ratios reference/ours (above 1:
ours is faster or smaller), of both times.

    python bench/norms.py
    python bench/norms.py --shapes 8192,4096 16384,8192
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.kernels import layer_norm, reference, rms_norm  # noqa: E402

EPS = 1e-5


def implementations(kind: str) -> dict:
    reference_fn = reference.rms_norm if kind == "rms_norm" else reference.layer_norm
    ours = rms_norm if kind == "rms_norm" else layer_norm
    if kind == "rms_norm":
        native = lambda x, w, b: F.rms_norm(x, x.shape[-1:], w, EPS)
    else:
        native = lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS)
    if kind == "rms_norm":
        return {
            "ours": lambda x, w, b: ours(x, w, EPS),
            "reference": lambda x, w, b: reference_fn(x, w, EPS),
            "reference compiled": torch.compile(lambda x, w, b: reference_fn(x, w, EPS)),
            "torch": native,
        }
    return {
        "ours": lambda x, w, b: ours(x, w, b, EPS),
        "reference": lambda x, w, b: reference_fn(x, w, b, EPS),
        "reference compiled": torch.compile(lambda x, w, b: reference_fn(x, w, b, EPS)),
        "torch": native,
    }


def measure(fn, x, w, b, grad_out) -> tuple[float, float, float, float]:
    """(forward ms, forward+backward ms, the same as CUDA-graph replays, forward+backward peak MiB
    above the inputs)."""
    from triton.testing import do_bench, do_bench_cudagraph

    inputs = (x, w, b) if b is not None else (x, w)

    def both():
        torch.autograd.grad(fn(x, w, b), inputs, grad_out)

    with torch.no_grad():
        forward = do_bench(lambda: fn(x, w, b), warmup=25, rep=100, return_mode="median")
    backward = do_bench(both, warmup=25, rep=100, return_mode="median")
    backward_graph = do_bench_cudagraph(both, rep=50, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    both()
    torch.cuda.synchronize()
    return forward, backward, backward_graph, (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="*", default=["8192,4096", "8192,8192"], help="tokens,hidden"
    )
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/norms.py needs a GPU (CUDA or ROCm)")
    header = (
        "| norm | tokens,hidden | implementation | fwd ms | fwd+bwd ms | fwd+bwd ms, CUDA graph | "
        "fwd+bwd peak MiB "
        "| reference/this fwd+bwd | reference/this fwd+bwd, CUDA graph |"
    )
    lines = [header, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for kind in ("rms_norm", "layer_norm"):
        for spec in args.shapes:
            tokens, hidden = (int(n) for n in spec.split(","))
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            b = (
                torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                if kind == "layer_norm"
                else None
            )
            grad_out = torch.randn_like(x)
            results = {
                name: measure(fn, x, w, b, grad_out) for name, fn in implementations(kind).items()
            }
            for name, (forward, both, both_graph, peak) in results.items():
                lines.append(
                    f"| {kind} | {tokens},{hidden} | {name} | {forward:.3f} | {both:.3f} | "
                    f"{both_graph:.3f} | "
                    f"{peak:.0f} | {results['reference'][1] / both:.2f} | "
                    f"{results['reference'][2] / both_graph:.2f} |"
                )
    text = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
