"""Bias-gradient reductions: torch's sum over rows against a matrix product with a ones vector; GELU backward."""
import torch, torch.nn.functional as F
from triton.testing import do_bench
torch.manual_seed(0)
rows = 16384
for width in (2048, 6144, 8192):
    dy = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    ones = torch.ones(1, rows, device="cuda", dtype=torch.bfloat16)
    a = dy.sum(0); b = (ones @ dy).view(-1); c = dy.t().mv(ones.view(-1))
    err = ((a.float() - b.float()).norm() / a.float().norm()).item()
    t_sum = do_bench(lambda: dy.sum(0), rep=200); t_mm = do_bench(lambda: ones @ dy, rep=200); t_mv = do_bench(lambda: dy.t().mv(ones.view(-1)), rep=200)
    gb = rows * width * 2 / 1e9
    print(f"width {width}: sum {t_sum*1e3:.1f} us ({gb/t_sum*1e3:.0f} GB/s), ones@dy {t_mm*1e3:.1f} us ({gb/t_mm*1e3:.0f} GB/s), mv {t_mv*1e3:.1f} us; rel diff {err:.1e}")
pre = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16); g = torch.randn_like(pre)
t = do_bench(lambda: torch.ops.aten.gelu_backward(g, pre, approximate="tanh"), rep=200)
print(f"gelu backward 16384x8192: {t*1e3:.1f} us ({3*rows*8192*2/1e9/t*1e3:.0f} GB/s)")
x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16); h = torch.randn_like(x)
t = do_bench(lambda: x + h, rep=200)
print(f"residual add 16384x2048: {t*1e3:.1f} us ({3*rows*2048*2/1e9/t*1e3:.0f} GB/s)")
