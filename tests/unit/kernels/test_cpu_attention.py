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


def _transformers_sliding_window_mask(window: int, position_ids: torch.Tensor) -> torch.Tensor:
    """Which keys each query sees, (batch, 1, seq, seq), as transformers' Mistral and Gemma build
    it for their sliding-window layers (eager attention's additive mask: 0 where seen); packed
    documents restart their position ids."""
    from transformers import MistralConfig
    from transformers.masking_utils import create_sliding_window_causal_mask

    config = MistralConfig(
        sliding_window=window,
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
        vocab_size=16,
    )
    config._attn_implementation = "eager"
    batch, seq = position_ids.shape
    mask = create_sliding_window_causal_mask(
        config=config,
        inputs_embeds=torch.zeros(batch, seq, 16),
        attention_mask=None,
        cache=None,
        position_ids=position_ids,
    )
    return mask == 0


def _packed_positions(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment ids and the position ids that restart at each document, for one row."""
    segments = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    positions = torch.cat([torch.arange(n) for n in lengths])
    return segments, positions


@pytest.mark.parametrize("window", [1, 4, 7, 30])
def test_sliding_window_mask_is_transformers_mask(window):
    """Query i sees key j when 0 <= i - j < window, within its document: the reference's mask is
    the one transformers builds (`create_sliding_window_causal_mask`, kv_idx > q_idx - window),
    for one document and for packed ones."""
    rows = [_packed_positions([20]), _packed_positions([3, 9, 1, 7])]
    segment_ids = torch.stack([segments for segments, _ in rows])
    position_ids = torch.stack([positions for _, positions in rows])
    expected = _transformers_sliding_window_mask(window, position_ids)
    q = torch.zeros(2, 1, 20, 8)
    allowed, _ = reference._mask(q, True, None, segment_ids, window)
    assert torch.equal(allowed.expand_as(expected), expected)
    # and the mask alone, without documents
    allowed, _ = reference._mask(q, True, None, None, window)
    assert torch.equal(allowed[0, 0], expected[0, 0])


@pytest.mark.parametrize("window", [None, 5])
def test_softcap_attention_is_gemma2_eager_attention(window):
    """Scaled scores capped to c * tanh(s / c), then masked (Gemma 2's order), with GQA: the
    reference equals transformers' Gemma 2 eager attention, and so does its scoring path."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 20, 16, generator=generator) * 3
    k, v = (torch.randn(2, 2, 20, 16, generator=generator) * 3 for _ in range(2))
    segments, positions = _packed_positions([8, 12])
    segment_ids, position_ids = segments.repeat(2, 1), positions.repeat(2, 1)
    if window is None:
        seen = torch.tril(torch.ones(20, 20, dtype=torch.bool))
        seen = seen & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    else:
        seen = _transformers_sliding_window_mask(window, position_ids)
    additive = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))
    module = SimpleNamespace(num_key_value_groups=2, training=False)
    expected, _ = eager_attention_forward(
        module, q, k, v, additive, scaling=0.2, softcap=5.0
    )  # (batch, seq, heads, head_dim)
    options = dict(segment_ids=segment_ids, softmax_scale=0.2, softcap=5.0, sliding_window=window)
    for attend in (reference.attention, reference.scoring_attention):
        got = attend(q, k, v, **options).transpose(1, 2)
        assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


@pytest.mark.parametrize("case", ["window", "window+alibi+documents", "softcap+window"])
def test_scoring_attention_with_window_and_softcap_is_the_oracle(case):
    q, k, v, segments, slopes = _inputs(torch.float32)
    options = {
        "window": {"sliding_window": 9},
        "window+alibi+documents": {
            "sliding_window": 20,
            "alibi_slopes": slopes,
            "segment_ids": segments,
        },
        "softcap+window": {"sliding_window": 20, "softcap": 3.0, "segment_ids": segments},
    }[case]
    expected = reference.attention(q, k, v, **options)
    got = reference.scoring_attention(q, k, v, **options)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
