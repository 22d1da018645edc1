"""Tensor parallelism, Megatron-style: each linear layer cut across the ranks of a tensor-parallel
group.

`apply_tensor_parallel` is applied to the plain model's parts (torchtitan style) and swaps their
layers:

- attention (`TensorParallelAttention`): q, k, v column-parallel by heads (each rank keeps
  num_heads/tp query and num_kv_heads/tp key/value heads, so grouped-query attention stays within a
  rank) with their biases and ALiBi slopes, out row-parallel; q/k norms per head (Qwen3) whole on
  every rank, their weights' gradients summed over the ranks (each rank's heads add their share),
  and q/k norms over all heads (OLMo 2) cut by head, the sum of squares they divide by summed over
  the ranks;
- MLP (`TensorParallelMLP`): gate and up column-parallel, down row-parallel;
- embedding and LM head (tied or not): vocab-parallel, the vocabulary padded to a multiple of
  model.pad_vocab_multiple x tp so that every rank holds an equal shard;
- norms: replicated (their inputs are the same on every rank), or on sequence parts (below).

Each row-parallel layer all-reduces its output in the forward. In the backward, the gradient of an
input that column-parallel layers share is all-reduced once, where it enters the attention, the MLP
or the LM head: one all-reduce for q, k and v together and one for gate and up (`column_parallel`,
one product over their weights stacked on the fly, as Megatron's fused projections are, while every
tensor keeps the single model's name); and, as in Megatron, that all-reduce runs while the same
layers compute their weights' gradients, which do not need it (on two H200 it gained little: the
all-reduce kernels wait for the GEMMs' SMs; BENCHMARKS.md). So a block costs two all-reduces of its
activations in the forward and two in the backward, in the activations' dtype (bf16 in training on
GPUs). The LM head leaves the logits cut by vocabulary; the training loss
(pipeline_model.token_loss) fuses this rank's rows of the head with the cross-entropy and combines
the per-token statistics over the ranks (max, sum of exponentials and target logit all-reduced), so
that the (tokens, vocab) logits are never gathered, nor even made whole on one rank.

Sequence parallelism (`parallel.sequence_parallel`, Megatron's): between the column- and
row-parallel layers, where the activations would be the same on every rank (norms, residual stream,
the activations passed between pipeline stages and kept for the backward), each rank holds only its
part of the tokens instead: a (batch, seq / tp, hidden) tensor holding the rank's consecutive run of
the batch's tokens in (batch, position) order, which the layers there treat token by token.
(Megatron gets such contiguous parts from its (seq, batch, hidden) layout; the collectives then need
no copy on either side.) An all-gather replaces the identity before the column-parallel layers
(reduce-scatter of the gradient instead of its all-reduce), and a reduce-scatter the all-reduce
after the row-parallel layers and the embedding: the same bytes on the wire, a tp-th of the norms'
work and of those activations' memory. The norms' weights and the row-parallel biases then see this
rank's tokens only, so their gradients are summed over the ranks (`_replicated`). The sequence
length must be a multiple of tp.

Every parallel layer is built from the full layer and keeps its shard of each full tensor; a sharded
parameter carries its `Shard` as `tp_shard` (how it is cut: to load a shard from a full tensor, to
gather the full one back for saving) and `tensor_model_parallel = True`, which DeepSpeed reads to
count it on every rank when it sums the global gradient norm (replicated parameters are counted on
tensor-parallel rank 0 only).

In training the layers are cut on the meta device (pipeline/parallel/pipeline_model.py), so the full
layer costs no memory, and each rank then reads its shards from the starting model's file. Random
numbers: the model has no dropout, so the ranks of a group need no separate random streams. (Dropout
inside a tensor-parallel region would need a generator seeded per tensor-parallel rank.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline.model.model_config import ModelConfig
from pipeline.model.transformer import (
    MLP,
    Attention,
    Block,
    Embedding,
    Head,
    LayerNorm,
    RMSNorm,
    stacked_parameter_grads,
)
from pipeline.parallel.parallel_config import check_tensor_parallel


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward, all-reduce backward: where a replicated activation enters column-parallel
    layers, each rank's gradient covers its own shard only, and the sum is the full gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward, identity backward: partial results of every rank summed into the full
    one, whose gradient every rank already has whole."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _sequence_parts(x: torch.Tensor, group) -> int:
    world = dist.get_world_size(group)
    if x.shape[1] % world:
        raise ValueError(
            f"parallel.sequence_parallel: a sequence of {x.shape[1]} tokens does not split into "
            f"parallel.tp={world} equal parts. Train on sequences of a multiple of {world} tokens "
            f"(train.seq_len), or set parallel.sequence_parallel=false."
        )
    return world


def _all_gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """(batch, seq / tp, ...) on every rank -> (batch, seq, ...), the ranks' runs of tokens in rank
    order."""
    whole = x.new_empty((x.shape[0], x.shape[1] * dist.get_world_size(group), *x.shape[2:]))
    dist.all_gather_into_tensor(whole.flatten(0, 1), x.contiguous().flatten(0, 1), group=group)
    return whole


def _reduce_scatter_sequence(
    x: torch.Tensor, group, async_op: bool = False
) -> tuple[torch.Tensor, Optional[dist.Work]]:
    """(batch, seq, ...) on every rank -> this rank's (batch, seq / tp, ...) run of tokens of their
    sum, and with `async_op` the running collective's handle, to wait for before the part is read
    (else None)."""
    world = _sequence_parts(x, group)
    part = x.new_empty((x.shape[0], x.shape[1] // world, *x.shape[2:]))
    return part, dist.reduce_scatter_tensor(
        part.flatten(0, 1), x.contiguous().flatten(0, 1), group=group, async_op=async_op
    )


class _GatherFromSequenceParallel(torch.autograd.Function):
    """All-gather forward along the sequence, reduce-scatter backward: where sequence parts enter
    column-parallel layers, each rank's gradient of the whole sequence covers its own output
    features only, and this rank's part of their sum is its gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_sequence(grad, ctx.group)[0], None


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Reduce-scatter forward along the sequence, all-gather backward: the partial results of
    row-parallel layers summed, each rank keeping its part of the sequence, whose gradient every
    rank needs whole."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_sequence(x, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_sequence(grad, ctx.group), None


class _ColumnParallel(torch.autograd.Function):
    """x -> x W_i^T + b_i for each of the column-parallel layers that read x (q, k, v; gate, up),
    side by side along the last axis from one product over their stacked weights, with x entering
    the tensor-parallel region once (all-gathered from sequence parts with sequence parallelism).
    The backward computes x's gradient (one product), starts its all-reduce (reduce-scatter) over
    the ranks and computes the weights' gradients while it runs."""

    @staticmethod
    def forward(ctx, x, group, sequence_parallel, *weights_and_biases):
        whole = _all_gather_sequence(x, group) if sequence_parallel else x
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.save_for_backward(whole, *weights)
        ctx.group, ctx.sequence_parallel, ctx.has_bias = (
            group,
            sequence_parallel,
            biases[0] is not None,
        )
        return F.linear(whole, torch.cat(weights), torch.cat(biases) if ctx.has_bias else None)

    @staticmethod
    def backward(ctx, grad):
        whole, *weights = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x, pending = None, None
        if ctx.needs_input_grad[0]:
            grad_whole = (grad @ torch.cat(weights)).view(whole.shape)
            if ctx.sequence_parallel:
                grad_x, pending = _reduce_scatter_sequence(grad_whole, ctx.group, async_op=True)
            else:
                grad_x, pending = (
                    grad_whole,
                    dist.all_reduce(grad_whole, group=ctx.group, async_op=True),
                )
        parameter_grads = stacked_parameter_grads(
            grad,
            whole.reshape(-1, whole.shape[-1]),
            weights,
            ctx.has_bias,
            ctx.needs_input_grad[3:],
        )
        if pending is not None:
            pending.wait()
        return grad_x, None, None, *parameter_grads


def column_parallel(x: torch.Tensor, layers, group, sequence_parallel: bool) -> torch.Tensor:
    """The outputs of column-parallel `layers` that all read `x`, side by side along the last axis;
    `x` enters the tensor-parallel region here (replicated, or this rank's part of the tokens with
    sequence parallelism)."""
    parameters = [tensor for layer in layers for tensor in (layer.weight, layer.bias)]
    return _ColumnParallel.apply(x, group, sequence_parallel, *parameters)


def copy_to_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromTensorParallel.apply(x, group)


def enter_tensor_parallel(x: torch.Tensor, group, sequence_parallel: bool) -> torch.Tensor:
    """An activation on its way into column-parallel layers: replicated (all-reduce of its
    gradient), or with sequence parallelism this rank's part of the sequence (all-gathered;
    reduce-scatter of the gradient)."""
    if sequence_parallel:
        return _GatherFromSequenceParallel.apply(x, group)
    return copy_to_tensor_parallel(x, group)


def leave_tensor_parallel(partial: torch.Tensor, group, sequence_parallel: bool) -> torch.Tensor:
    """Row-parallel partial results summed over the ranks: whole on every rank (all-reduce), or with
    sequence parallelism each rank's part of the sequence (reduce-scatter; all-gather of the
    gradient)."""
    if sequence_parallel:
        return _ReduceScatterToSequenceParallel.apply(partial, group)
    return reduce_from_tensor_parallel(partial, group)


@dataclass(frozen=True)
class Shard:
    """How a tensor-parallel rank's parameter is cut from the full tensor: along `dim`, whose
    `full_size` is padded with zeros to `world` equal parts, each a multiple of `multiple`."""

    dim: int
    full_size: int
    group: object
    multiple: int = 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def size(self) -> int:
        parts = self.world * self.multiple
        return -(-self.full_size // parts) * self.multiple

    @property
    def start(self) -> int:
        return self.rank * self.size

    def full_shape(self, shape: torch.Size) -> tuple[int, ...]:
        return tuple(
            self.full_size if axis == self.dim else length for axis, length in enumerate(shape)
        )

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full tensor (padding rows are zeros)."""
        padding = self.size * self.world - self.full_size
        if padding:
            extra = list(full.shape)
            extra[self.dim] = padding
            full = torch.cat((full, full.new_zeros(extra)), dim=self.dim)
        return full.narrow(self.dim, self.start, self.size)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The full tensor from every rank's part (a collective over the group)."""
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=self.dim).narrow(self.dim, 0, self.full_size)


def _sharded(full: nn.Parameter, shard: Shard) -> nn.Parameter:
    parameter = nn.Parameter(shard.take(full.detach()).clone(), requires_grad=full.requires_grad)
    parameter.tp_shard = shard
    # DeepSpeed (runtime/utils.py is_model_parallel_parameter): count this shard on every rank in
    # the norm.
    parameter.tensor_model_parallel = True
    return parameter


def parameter_shards(module: nn.Module) -> dict[str, Shard]:
    """The Shard of each sharded parameter of `module`, by its state-dict name."""
    return {
        name: parameter.tp_shard
        for name, parameter in module.named_parameters(remove_duplicate=False)
        if hasattr(parameter, "tp_shard")
    }


class ColumnParallelLinear(nn.Module):
    """y_r = x W_r^T + b_r: this rank's output features (rows of the full weight). The model applies
    these layers through `column_parallel`, all that read one input together; alone, the input must
    have entered the tensor-parallel region already (`copy_to_tensor_parallel`)."""

    def __init__(self, full: nn.Linear, group) -> None:
        super().__init__()
        self.group = group
        shard = Shard(0, full.out_features, group)
        self.weight = _sharded(full.weight, shard)
        self.bias = _sharded(full.bias, shard) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b: this rank's input features (columns of the full weight), the input
    already cut the same way by a column-parallel layer; the bias is replicated and added once,
    after the sum (with sequence parallelism to this rank's part of the sequence, so its gradient is
    summed over the ranks)."""

    def __init__(self, full: nn.Linear, group, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.weight = _sharded(full.weight, Shard(1, full.in_features, group))
        self.bias = full.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = leave_tensor_parallel(F.linear(x, self.weight), self.group, self.sequence_parallel)
        return (
            y
            if self.bias is None
            else y + _replicated(self.bias, self.group, self.sequence_parallel)
        )


def _replicated(parameter: torch.Tensor, group, sequence_parallel: bool) -> torch.Tensor:
    """A replicated parameter as a layer applies it: with sequence parallelism to this rank's tokens
    only, so that its gradient is this rank's share, summed over the ranks in the backward."""
    return copy_to_tensor_parallel(parameter, group) if sequence_parallel else parameter


class _GroupRMSNorm(RMSNorm):
    """An RMSNorm made from the model's `full` one for a tensor-parallel `group`: its weight, eps
    and unit offset; the subclasses say how the weight is applied (or cut)."""

    def __init__(self, full: RMSNorm, group) -> None:
        nn.Module.__init__(self)
        self.group = group
        self.weight = full.weight
        self.eps = full.eps
        self.unit_offset = full.unit_offset


class SequenceParallelRMSNorm(_GroupRMSNorm):
    """RMSNorm on this rank's part of the sequence (parallel.sequence_parallel): the weight is whole
    on every rank, its gradient summed over the ranks."""

    def applied_weight(self) -> torch.Tensor:
        return self.scale(_replicated(self.weight, self.group, True))


class SequenceParallelLayerNorm(LayerNorm):
    """LayerNorm on this rank's part of the sequence (parallel.sequence_parallel): weight and bias
    are whole on every rank, their gradients summed over the ranks."""

    def __init__(self, full: LayerNorm, group) -> None:
        nn.Module.__init__(self)
        self.group = group
        self.normalized_shape, self.eps, self.elementwise_affine = (
            full.normalized_shape,
            full.eps,
            full.elementwise_affine,
        )
        self.weight = full.weight
        self.bias = full.bias

    def applied_weights(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        bias = None if self.bias is None else _replicated(self.bias, self.group, True)
        return _replicated(self.weight, self.group, True), bias


def sequence_parallel_norm(norm: nn.Module, group) -> nn.Module:
    return (
        SequenceParallelRMSNorm(norm, group)
        if isinstance(norm, RMSNorm)
        else SequenceParallelLayerNorm(norm, group)
    )


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding; an id held by another rank looks up zeros here, and the
    sum over the ranks is the full lookup (with sequence parallelism, this rank's part of the
    sequence of it). `logits` uses the same shard as a tied LM head."""

    def __init__(
        self, full: nn.Embedding, group, multiple: int, sequence_parallel: bool = False
    ) -> None:
        super().__init__()
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.weight = _sharded(full.weight, Shard(0, full.num_embeddings, group, multiple))

    @property
    def vocab_start(self) -> int:
        return self.weight.tp_shard.start

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.vocab_start
        elsewhere = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        return leave_tensor_parallel(
            rows.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.group, self.sequence_parallel
        )

    def enter(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden states on their way into this shard as a tied LM head."""
        return enter_tensor_parallel(hidden, self.group, self.sequence_parallel)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary shard of the logits (padding ids included)."""
        return F.linear(self.enter(hidden), self.weight)


class VocabParallelHead(nn.Module):
    """An untied LM head cut by vocabulary: this rank's shard of the logits (padding ids included;
    the vocab-parallel cross-entropy leaves them out)."""

    def __init__(self, full: Head, group, multiple: int, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.weight = _sharded(full.weight, Shard(0, full.out_features, group, multiple))

    def enter(self, hidden: torch.Tensor) -> torch.Tensor:
        return enter_tensor_parallel(hidden, self.group, self.sequence_parallel)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.enter(hidden), self.weight)


class _AllReduceSum(torch.autograd.Function):
    """All-reduce forward and backward: a sum over the ranks that every rank uses, so that each
    rank's addend gets the gradients of all of them."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class HeadSummedRMSNorm(_GroupRMSNorm):
    """A per-head q or k norm (Qwen3) on this rank's heads: its weight (head_dim values) whole on
    every rank, its gradient summed over the ranks, whose heads each contribute a share."""

    def applied_weight(self) -> torch.Tensor:
        return self.scale(copy_to_tensor_parallel(self.weight, self.group))


class HeadShardedRMSNorm(_GroupRMSNorm):
    """A q or k norm over all heads at once (OLMo 2) on this rank's heads: the weight cut by head,
    as the projection's rows are; each token's sum of squares summed over the ranks before it is
    divided by the full width. Plain PyTorch (no fused kernel: the statistic crosses ranks)."""

    def __init__(self, full: RMSNorm, group) -> None:
        super().__init__(full, group)
        self.full_size = full.weight.shape[0]
        self.weight = _sharded(full.weight, Shard(0, self.full_size, group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        squares = _AllReduceSum.apply(x32.pow(2).sum(-1, keepdim=True), self.group)
        normed = x32 * torch.rsqrt(squares / self.full_size + self.eps)
        return (normed * self.applied_weight().float()).to(x.dtype)


class TensorParallelAttention(Attention):
    """Attention cut by heads: this rank's num_heads/tp query and num_kv_heads/tp key/value heads
    (so grouped-query attention stays within a rank), their biases, q/k norms and ALiBi slopes, and
    the output projection's matching input columns."""

    def __init__(self, full: Attention, group, sequence_parallel: bool = False) -> None:
        nn.Module.__init__(self)
        self.cfg = full.cfg
        self.window, self.local_rope = full.window, full.local_rope
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.q, self.k, self.v = (
            ColumnParallelLinear(linear, group) for linear in (full.q, full.k, full.v)
        )
        self.out = RowParallelLinear(full.out, group, sequence_parallel)
        norm = {"head": HeadSummedRMSNorm, "full": HeadShardedRMSNorm}.get(full.cfg.qk_norm)
        self.q_norm, self.k_norm = (
            (None, None) if norm is None else (norm(full.q_norm, group), norm(full.k_norm, group))
        )
        heads = full.cfg.num_heads // dist.get_world_size(group)
        self.heads = slice(dist.get_rank(group) * heads, (dist.get_rank(group) + 1) * heads)

    def alibi_slopes(self, device: torch.device) -> torch.Tensor:
        return super().alibi_slopes(device)[self.heads]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel(x, (self.q, self.k, self.v), self.group, self.sequence_parallel)


class TensorParallelMLP(MLP):
    """The MLP cut by hidden units: this rank's columns of gate and up, the matching rows of down."""

    def __init__(self, full: MLP, group, sequence_parallel: bool = False) -> None:
        nn.Module.__init__(self)
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.activation, self.gated = full.activation, full.gated
        if self.gated:
            self.gate = ColumnParallelLinear(full.gate, group)
        self.up = ColumnParallelLinear(full.up, group)
        self.down = RowParallelLinear(full.down, group, sequence_parallel)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.gated:
            return column_parallel(
                x, (self.gate, self.up), self.group, self.sequence_parallel
            ).chunk(2, dim=-1)
        return (column_parallel(x, (self.up,), self.group, self.sequence_parallel),)


def apply_tensor_parallel(
    part: nn.Module, cfg: ModelConfig, group, sequence_parallel: bool = False
) -> nn.Module:
    """Make one part of the plain model tensor-parallel over `group`: a Block or an Embedding in
    place, a Head replaced (the returned module; use it instead of `part`); norms stay as they are
    (replicated), or with `sequence_parallel` work on this rank's part of the sequence, as the
    block's residual stream does."""
    tp = dist.get_world_size(group)
    check_tensor_parallel(cfg, tp)
    if isinstance(part, Block):
        part.attn = TensorParallelAttention(part.attn, group, sequence_parallel)
        part.mlp = TensorParallelMLP(part.mlp, group, sequence_parallel)
        if sequence_parallel:
            for name in ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm"):
                if getattr(part, name) is not None:
                    setattr(part, name, sequence_parallel_norm(getattr(part, name), group))
    elif isinstance(part, Embedding):
        part.tokens = VocabParallelEmbedding(
            part.tokens, group, cfg.pad_vocab_multiple, sequence_parallel
        )
        if sequence_parallel and part.norm is not None:
            part.norm = sequence_parallel_norm(part.norm, group)
    elif isinstance(part, Head):
        return VocabParallelHead(part, group, cfg.pad_vocab_multiple, sequence_parallel)
    return part


def tensor_parallel_rank(modules: list[nn.Module]) -> Optional[int]:
    """This rank's place in the tensor-parallel group of the modules' shards (None if nothing is
    sharded)."""
    for module in modules:
        for shard in parameter_shards(module).values():
            return shard.rank
    return None
