"""Bias-gradient sums at the 1.3B model's shapes: torch's sum over rows against a product with a ones vector; GELU's
backward and a residual addition for scale. Printed into bias_and_add_micro.txt (one H100, 2026-11-27)."""

import torch
from triton.testing import do_bench

torch.manual_seed(0)
rows = 16384
for width in (2048, 6144, 8192):
    grad = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    ones = torch.ones(1, rows, device="cuda", dtype=torch.bfloat16)
    summed, product = grad.sum(0), (ones @ grad).view(-1)
    difference = ((summed.float() - product.float()).norm() / summed.float().norm()).item()
    sum_ms = do_bench(lambda: grad.sum(0), rep=200)
    product_ms = do_bench(lambda: ones @ grad, rep=200)
    vector_ms = do_bench(lambda: grad.t().mv(ones.view(-1)), rep=200)
    gigabytes = rows * width * 2 / 1e9
    print(f"width {width}: sum {sum_ms * 1e3:.1f} us ({gigabytes / sum_ms * 1e3:.0f} GB/s), ones@dy "
          f"{product_ms * 1e3:.1f} us ({gigabytes / product_ms * 1e3:.0f} GB/s), mv {vector_ms * 1e3:.1f} us; "
          f"rel diff {difference:.1e}")
pre = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16)
grad = torch.randn_like(pre)
ms = do_bench(lambda: torch.ops.aten.gelu_backward(grad, pre, approximate="tanh"), rep=200)
print(f"gelu backward 16384x8192: {ms * 1e3:.1f} us ({3 * rows * 8192 * 2 / 1e9 / ms * 1e3:.0f} GB/s)")
x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
h = torch.randn_like(x)
ms = do_bench(lambda: x + h, rep=200)
print(f"residual add 16384x2048: {ms * 1e3:.1f} us ({3 * rows * 2048 * 2 / 1e9 / ms * 1e3:.0f} GB/s)")
