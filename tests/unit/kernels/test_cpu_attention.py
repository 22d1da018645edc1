"""The CPU attention paths: `scoring_attention` (PyTorch's fused attention, for forwards without an
autograd graph) gives what the oracle `attention` gives, and `flash_attention` on a CPU takes it
only where no graph is built."""

from __future__ import annotations

import pytest
import torch

import pipeline.kernels as kernels
from pipeline.kernels import reference


def _inputs(dtype, batch=2, heads=6, kv_heads=2, seq=70, head_dim=16):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, h, seq, head_dim, generator=generator).to(dtype)
        for h in (heads, kv_heads, kv_heads)
    )
    # Documents of 1, 9, 30 and 30 tokens in row 0; one document in row 1.
    segments = torch.tensor([[0] + [1] * 9 + [2] * 30 + [3] * 30, [0] * seq])
    slopes = torch.rand(heads, generator=generator)
    return q, k, v, segments, slopes


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "case", ["causal", "alibi", "documents", "alibi+documents", "not causal", "scale"]
)
def test_scoring_attention_is_the_oracle(dtype, tolerance, case):
    q, k, v, segments, slopes = _inputs(dtype)
    options = {
        "causal": {},
        "alibi": {"alibi_slopes": slopes},
        "documents": {"segment_ids": segments},
        "alibi+documents": {"alibi_slopes": slopes, "segment_ids": segments},
        "not causal": {"causal": False},
        "scale": {"softmax_scale": 0.3, "alibi_slopes": slopes},
    }[case]
    expected = reference.attention(q, k, v, **options)
    got = reference.scoring_attention(q, k, v, **options)
    assert got.dtype == dtype
    assert torch.allclose(got.float(), expected.float(), atol=tolerance), (
        (got.float() - expected.float()).abs().max()
    )


def test_cpu_attention_builds_the_oracles_graph_and_scores_without_one(monkeypatch):
    q, k, v, segments, slopes = _inputs(torch.float32)
    calls = []
    for name in ("attention", "scoring_attention"):
        original = getattr(reference, name)
        monkeypatch.setattr(
            reference, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    with torch.no_grad():
        kernels.flash_attention(q, k, v, alibi_slopes=slopes, segment_ids=segments)
    kernels.flash_attention(q, k, v)  # no input needs a gradient
    kernels.flash_attention(q.requires_grad_(), k, v).sum().backward()
    assert calls == ["scoring_attention", "scoring_attention", "attention"] and q.grad is not None
