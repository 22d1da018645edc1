"""The LM head fused with the cross-entropy (pipeline/kernels/fused_head.py), the training loss,
against the plain cross-entropy of whole logits on CPU: loss and gradients, mean and sum, chunks,
ignored targets. The Triton primitives run the same code under the interpreter
(tests/unit/kernels/test_kernels_interpreted.py); tensor-parallel shards are checked on gloo ranks
(tests/unit/parallel/test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from pipeline.kernels import linear_cross_entropy, reference


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_fused_head_matches_whole_logits(reduction, chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    targets[0, :3] = -100
    fused = linear_cross_entropy(
        hidden, weight, targets, chunk_size=chunk_size, reduction=reduction
    )
    grads = torch.autograd.grad(fused * 3.0, (hidden, weight))
    whole = reference.linear_cross_entropy(
        hidden.double(), weight.double(), targets, reduction=reduction
    )
    expected = torch.autograd.grad(whole * 3.0, (hidden, weight))
    assert fused.item() == pytest.approx(whole.item(), rel=1e-5)
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want.float(), rtol=1e-4, atol=1e-6)


def test_no_counted_target_gives_zero_not_nan():
    hidden = torch.randn(2, 4, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    targets = torch.full((2, 4), -100)
    for reduction in ("mean", "sum"):
        loss = linear_cross_entropy(hidden, weight, targets, reduction=reduction)
        loss.backward()
        assert (
            loss.item() == 0.0
            and torch.count_nonzero(hidden.grad) == 0
            and torch.count_nonzero(weight.grad) == 0
        )


@pytest.mark.parametrize("chunk_size", [4, 64])
def test_soft_capped_logits_match_capping_whole_logits(chunk_size):
    """Gemma 2's final_logit_softcapping: c * tanh(logits / c) before the cross-entropy; a cap of 2
    on logits of spread ~4 changes the loss, so a missing cap or slope shows."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    fused = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size, softcap=2.0)
    grads = torch.autograd.grad(fused, (hidden, weight))
    logits = hidden.double() @ weight.double().t()
    whole = torch.nn.functional.cross_entropy(
        (torch.tanh(logits / 2.0) * 2.0).flatten(0, 1), targets.flatten()
    )
    expected = torch.autograd.grad(whole, (hidden, weight))
    uncapped = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert abs(whole.item() - uncapped.item()) > 0.5
    assert fused.item() == pytest.approx(whole.item(), rel=1e-5)
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want.float(), rtol=1e-4, atol=1e-6)
