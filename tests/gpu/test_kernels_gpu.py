"""The Triton kernels on a real GPU in bf16 against the references (upcast to float32): outputs and
gradients.

CI has no GPU, so this file runs only where one is (the CPU suite covers the same kernels under the
Triton interpreter in tests/unit/kernels/test_kernels_interpreted.py): `PYTHONPATH=. python -m
pytest -q tests/gpu/test_kernels_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.kernels import (
    add_layer_norm,
    add_rms_norm,
    flash_attention,
    kernel_backend,
    layer_norm,
    linear_cross_entropy,
    rms_norm,
    rotate_stacked_qkv,
    stacked_flash_attention,
    vocab_shard_statistics,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")

# bf16 has an 8-bit mantissa (relative rounding 2^-9 ~ 2e-3); a kernel's bf16 outputs and gradients
# land within a few of those from the float32 reference, an indexing or masking bug lands far
# outside.
BF16_TOLERANCE = 2e-2


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(actual).all(), "non-finite values in the kernel's result"
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def compare_with_reference(function, inputs: list[torch.Tensor], **kwargs) -> None:
    """Run `function` with the Triton kernels on bf16 inputs and with the references on their
    float32 copies; a function may return one tensor or a tuple, and every output gets a random
    gradient."""
    inputs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    expected_inputs = [
        x.detach().float().requires_grad_(x.is_floating_point()) if x.is_floating_point() else x
        for x in inputs
    ]
    outs = function(*inputs, **kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grad_outs = [torch.randn_like(out) for out in outs]
    differentiable = [x for x in inputs if x.requires_grad]
    grads = torch.autograd.grad(outs, differentiable, grad_outs)
    with kernel_backend("reference"):
        expected = function(*expected_inputs, **kwargs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    expected_grads = torch.autograd.grad(
        expected,
        [x for x in expected_inputs if x.requires_grad],
        [grad.float() for grad in grad_outs],
    )
    names = [f"output {i}" for i in range(len(outs))] + [f"grad {i}" for i in range(len(grads))]
    for name, actual, reference in zip(
        names, [*outs, *grads], [*expected, *expected_grads], strict=True
    ):
        error = relative_error(actual, reference)
        assert error < BF16_TOLERANCE, f"{name}: relative error {error:.2e} >= {BF16_TOLERANCE}"


def packed_rows(batch: int, seq: int, mean: int = 700) -> torch.Tensor:
    """Document ids 0, 1, ... of documents of exponential lengths (mean `mean`); the first row is
    one document and the second ends in one-token documents, where the batch has two rows or more."""
    generator = torch.Generator().manual_seed(seq)
    lengths = (
        torch.empty(batch * seq).exponential_(1.0 / mean, generator=generator).long() + 1
    ).cumsum(0)
    ids = torch.searchsorted(lengths, torch.arange(batch * seq), right=True).view(batch, seq)
    ids = ids - ids[:, :1]
    if batch > 1:
        ids[0] = 0
        ids[1, -40:] = ids[1, -41] + 1 + torch.arange(40)
    return ids


@pytest.mark.parametrize(
    "batch, heads, kv_heads, seq, head_dim, causal, alibi, segments",
    [
        (2, 8, 8, 1024, 128, True, True, None),
        (2, 8, 2, 1000, 64, True, True, "random"),
        (1, 4, 1, 777, 80, True, False, "random"),
        (1, 4, 4, 513, 96, False, True, None),
        (2, 16, 16, 2048, 128, True, False, None),
        (
            4,
            8,
            8,
            2048,
            128,
            True,
            True,
            "packed",
        ),  # the benchmark's rows, with the sm90 document tiles
        (4, 8, 4, 2048, 64, True, True, "packed"),
    ],
)
def test_attention_matches_reference_in_bf16(
    batch, heads, kv_heads, seq, head_dim, causal, alibi, segments
):
    torch.manual_seed(seq)
    q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        for _ in range(2)
    )
    slopes = torch.rand(heads, device="cuda") * 0.3 if alibi else None
    segment_ids = None
    if segments == "random":
        segment_ids = torch.randint(0, 4, (batch, seq), device="cuda").sort(dim=1).values
    elif segments == "packed":
        segment_ids = packed_rows(batch, seq).cuda()
    compare_with_reference(
        flash_attention, [q, k, v], causal=causal, alibi_slopes=slopes, segment_ids=segment_ids
    )


@pytest.mark.parametrize(
    "batch, heads, kv_heads, seq, head_dim, causal, window, softcap, segments",
    [
        (2, 8, 8, 2048, 128, True, 512, None, None),  # a window of a quarter of the row
        (1, 8, 2, 777, 80, True, 33, None, None),  # GQA, narrower than a tile, padded head dim
        (2, 8, 2, 1000, 64, True, 100, None, "random"),  # documents, GQA, odd length
        (4, 8, 4, 2048, 128, True, 256, None, "packed"),  # the benchmark's packed rows
        (2, 8, 4, 1024, 128, True, None, 2.0, None),  # soft cap (Gemma 2's global layers)
        (1, 4, 4, 513, 96, False, None, 1.5, None),  # soft cap, bidirectional
        (4, 8, 4, 2048, 64, True, 300, 3.0, "packed"),  # both (its local layers), packed rows
        (2, 8, 8, 1024, 128, True, 200, 3.0, "random"),
    ],
)
def test_attention_with_window_and_softcap_matches_reference_in_bf16(
    batch, heads, kv_heads, seq, head_dim, causal, window, softcap, segments
):
    """Sliding windows (Mistral, Gemma 2/3) and the soft cap (Gemma 2) on the GPU tables' tiles,
    with their variants' own where they have some."""
    torch.manual_seed(seq + head_dim)
    q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
        for _ in range(2)
    )
    segment_ids = None
    if segments == "random":
        segment_ids = torch.randint(0, 4, (batch, seq), device="cuda").sort(dim=1).values
    elif segments == "packed":
        segment_ids = packed_rows(batch, seq).cuda()
    compare_with_reference(
        flash_attention,
        [q, k, v],
        causal=causal,
        segment_ids=segment_ids,
        sliding_window=window,
        softcap=softcap,
    )


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_stacked_attention_matches_reference_in_bf16(kv_heads):
    """q, k, v side by side as one projection makes them (a model's layout), packed rows: output and
    gradient."""
    torch.manual_seed(kv_heads)
    qkv = torch.randn(4, 2048, (8 + 2 * kv_heads) * 128, device="cuda", dtype=torch.bfloat16)
    slopes = torch.rand(8, device="cuda") * 0.5
    compare_with_reference(
        stacked_flash_attention,
        [qkv],
        heads=8,
        head_dim=128,
        alibi_slopes=slopes,
        segment_ids=packed_rows(4, 2048).cuda(),
    )


def test_stacked_attention_with_window_and_softcap_matches_reference_in_bf16():
    torch.manual_seed(1)
    qkv = torch.randn(4, 2048, (8 + 2 * 2) * 128, device="cuda", dtype=torch.bfloat16)
    compare_with_reference(
        stacked_flash_attention,
        [qkv],
        heads=8,
        head_dim=128,
        segment_ids=packed_rows(4, 2048).cuda(),
        sliding_window=400,
        softcap=3.0,
    )


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(32, 8, 128), (24, 8, 96)])
def test_rope_on_stacked_qkv_matches_reference_in_bf16(heads, kv_heads, head_dim):
    torch.manual_seed(heads)
    qkv = torch.randn(
        2, 1000, (heads + 2 * kv_heads) * head_dim, device="cuda", dtype=torch.bfloat16
    )
    cos, sin = torch.randn(2, 1000, head_dim, device="cuda").unbind(0)
    compare_with_reference(
        lambda qkv: rotate_stacked_qkv(qkv, heads, head_dim, cos.to(qkv.dtype), sin.to(qkv.dtype)),
        [qkv],
    )


@pytest.mark.parametrize("shape", [(4, 1000, 4096), (3000, 5120), (77, 8191)])
def test_norms_match_reference_in_bf16(shape):
    torch.manual_seed(shape[-1])
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    weight, bias = (torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16) for _ in range(2))
    compare_with_reference(lambda x, w: rms_norm(x, w, 1e-5), [x, weight])
    compare_with_reference(lambda x, w, b: layer_norm(x, w, b, 1e-5), [x, weight, bias])
    addend = torch.randn_like(x)
    compare_with_reference(lambda x, a, w: add_rms_norm(x, a, w, 1e-5), [x, addend, weight])
    compare_with_reference(
        lambda x, a, w, b: add_layer_norm(x, a, w, b, 1e-5), [x, addend, weight, bias]
    )


def test_linear_cross_entropy_matches_reference_in_bf16():
    torch.manual_seed(0)
    hidden = torch.randn(2, 1500, 512, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(32007, 512, device="cuda", dtype=torch.bfloat16) / 512**0.5
    targets = torch.randint(0, 32007, (2, 1500), device="cuda")
    targets[:, :100] = -100
    compare_with_reference(
        lambda h, w: linear_cross_entropy(h, w, targets, chunk_size=700), [hidden, weight]
    )


def test_vocab_shard_statistics_match_reference_in_bf16():
    torch.manual_seed(0)
    logits = torch.randn(3000, 20000, device="cuda", dtype=torch.bfloat16) * 3
    targets = torch.randint(0, 60000, (3000,), device="cuda")
    compare_with_reference(
        lambda x: torch.stack(vocab_shard_statistics(x, targets, 20000)), [logits]
    )
