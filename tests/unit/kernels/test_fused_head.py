"""The LM head fused with the cross-entropy (pipeline/kernels/fused_head.py), the training loss, against the
plain cross-entropy of whole logits on CPU: loss and gradients, mean and sum, chunks, ignored targets. The Triton
primitives run the same code under the interpreter (tests/unit/kernels/test_kernels_interpreted.py); tensor-parallel shards
are checked on gloo ranks (tests/unit/parallel/test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from pipeline.kernels import GatedRows, linear_cross_entropy, reference


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_fused_head_matches_whole_logits(reduction, chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    targets[0, :3] = -100
    fused = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size, reduction=reduction)
    grads = torch.autograd.grad(fused * 3.0, (hidden, weight))
    whole = reference.linear_cross_entropy(hidden.double(), weight.double(), targets, reduction=reduction)
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
        assert loss.item() == 0.0 and torch.count_nonzero(hidden.grad) == 0 and torch.count_nonzero(weight.grad) == 0


@pytest.mark.parametrize("chunk_size", [2, 64])
def test_gated_rows_learn_only_from_the_marked_sequences(chunk_size):
    """GatedRows: the weight's rows below `end` take their gradient from the marked sequences alone; the other rows
    and the hidden states from every token, as without the gate; no mark at all keeps the gated rows still."""
    torch.manual_seed(1)
    hidden = torch.randn(4, 5, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 40, (4, 5))
    learns = torch.tensor([[True], [False], [False], [True]])
    end = 25
    loss = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size, reduction="sum",
                                gated=GatedRows(end, learns))
    grad_hidden, grad_weight = torch.autograd.grad(loss, (hidden, weight))
    # The reference: unmarked sequences see the gated rows detached.
    kept = torch.cat([weight[:end].detach(), weight[end:]])
    marked, unmarked = learns[:, 0], ~learns[:, 0]
    whole = (reference.linear_cross_entropy(hidden[marked].double(), weight.double(), targets[marked], reduction="sum")
             + reference.linear_cross_entropy(hidden[unmarked].double(), kept.double(), targets[unmarked],
                                              reduction="sum"))
    want_hidden, want_weight = torch.autograd.grad(whole, (hidden, weight))
    assert loss.item() == pytest.approx(whole.item(), rel=1e-5)
    assert torch.allclose(grad_hidden, want_hidden.float(), rtol=1e-4, atol=1e-5)
    assert torch.allclose(grad_weight, want_weight.float(), rtol=1e-4, atol=1e-5)
    ungated = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets, reduction="sum"), weight)[0]
    close = dict(rtol=1e-4, atol=1e-5)
    assert not torch.allclose(grad_weight[:end], ungated[:end], **close)
    assert torch.allclose(grad_weight[end:], ungated[end:], **close)

    frozen = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size, reduction="sum",
                                  gated=GatedRows(end))
    grad_frozen = torch.autograd.grad(frozen, weight)[0]
    assert torch.count_nonzero(grad_frozen[:end]) == 0 and torch.allclose(grad_frozen[end:], ungated[end:], **close)
