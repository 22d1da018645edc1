"""A/B of the attention kernels' launch order (issue 30, 2026-11-27), all three in one process on one GPU:
old = pipeline/kernels/attention.py as committed; new = launch_order_new.patch applied to it (the heaviest
(row, block) pairs first, sorted per batch by a one-program Triton kernel, heads innermost; dense: blocks by rank
over all rows and heads); c = launch_order_c_after_new.patch on top (heaviest pairs first within each head, heads
outermost; dense: the committed order). Run from the repository root:

    python3 bench/results/packed_rows_2026-11-27_host/launch_order_ab.py 3 packed
    python3 bench/results/packed_rows_2026-11-27_host/launch_order_ab.py 2 dense [--flex]

Times are medians of CUDA-graph replays (packed) or of do_bench (dense), in milliseconds; the outputs and gradients
are compared with old's after the timings: in this script an eager backward before do_bench_cudagraph's capture made
the capture fail ("operation would make the legacy stream depend on a capturing blocking stream"), for the committed
kernel too.
"""

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pipeline.kernels.attention as committed  # noqa: E402
from attention import alibi_slopes, flex_methods, packed_segment_ids, time_forward_and_backward  # noqa: E402

PACKED = [(4, 16, 2048, 128), (2, 16, 4096, 128), (8, 32, 2048, 64), (4, 32, 4096, 64)]
DENSE = [(4, 16, 2048, 128), (2, 16, 4096, 128), (1, 16, 8192, 128), (8, 32, 2048, 64), (2, 32, 4096, 64)]


def patched(name: str, patches: list[str]):
    """The committed kernel module with these patches applied, imported from a temporary copy."""
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    shutil.copy(REPO / "pipeline" / "kernels" / "attention.py", path)
    for patch in patches:
        subprocess.run(["patch", "-s", str(path), str(HERE / patch)], check=True)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fwd_bwd(attend, q, k, v, grad_out):
    out = attend(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out))


def main() -> None:
    rounds, flex_on = int(sys.argv[1]), "--flex" in sys.argv
    kinds = [arg for arg in sys.argv[2:] if arg in ("packed", "dense")]
    modules = {"old": committed, "new": patched("order_new", ["launch_order_new.patch"]),
               "c": patched("order_c", ["launch_order_new.patch", "launch_order_c_after_new.patch"])}
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for kind in kinds:
        for batch, heads, seq, head_dim in PACKED if kind == "packed" else DENSE:
            started = time.time()
            slopes = alibi_slopes(heads).cuda()
            documents = packed_segment_ids(batch, seq).cuda() if kind == "packed" else None
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad_out = torch.randn_like(q)
            attends = {name: (lambda q, k, v, module=module: module.flash_attention(
                q, k, v, causal=True, alibi_slopes=slopes, segment_ids=documents)) for name, module in modules.items()}
            times = {name: [] for name in attends}
            for _ in range(rounds):
                for name, attend in attends.items():
                    times[name].append(time_forward_and_backward(attend, q, k, v, grad_out,
                                                                 cuda_graph=kind == "packed"))
            line = f"{kind} {batch},{heads},{seq},{head_dim}: "
            for name, measured in times.items():
                line += (f"{name} fwd " + "/".join(f"{t[0]:.4f}" for t in measured) + " fwd+bwd "
                         + "/".join(f"{t[1]:.4f}" for t in measured) + " ms; ")
            mean = {name: [sum(t[i] for t in measured) / rounds for i in (0, 1)] for name, measured in times.items()}
            for name in ("new", "c"):
                line += (f"{name}/old speed fwd {mean['old'][0] / mean[name][0]:.3f} "
                         f"fwd+bwd {mean['old'][1] / mean[name][1]:.3f}; ")
            if flex_on:
                flex = next(iter(flex_methods(heads, seq, slopes, documents).values()))
                flex_fwd, flex_both = time_forward_and_backward(flex, q, k, v, grad_out, cuda_graph=kind == "packed")
                line += (f"flex fwd {flex_fwd:.4f} fwd+bwd {flex_both:.4f} ms; vs flex fwd+bwd "
                         + " ".join(f"{name} {flex_both / mean[name][1]:.3f}" for name in mean) + "; ")
            results = {name: fwd_bwd(attend, q, k, v, grad_out) for name, attend in attends.items()}
            line += "bitwise-equal " + " ".join(
                f"{name}={all(torch.equal(a, b) for a, b in zip(results['old'], results[name]))}" for name in ("new", "c"))
            print(line + f" ({time.time() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
