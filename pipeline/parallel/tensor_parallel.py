"""Tensor parallelism, Megatron-style: each linear layer cut across the ranks of a tensor-parallel group.

`apply_tensor_parallel` is applied to the plain model's parts (torchtitan style) and swaps their layers:

- attention (`TensorParallelAttention`): q, k, v column-parallel by heads (each rank keeps num_heads/tp query and
  num_kv_heads/tp key/value heads, so grouped-query attention stays within a rank) with their ALiBi slopes, out
  row-parallel;
- MLP (`TensorParallelMLP`): gate and up column-parallel, down row-parallel;
- embedding and LM head (tied or not): vocab-parallel, the vocabulary padded to a multiple of
  model.pad_vocab_multiple x tp so that every rank holds an equal shard;
- norms: replicated (their inputs are the same on every rank).

Each row-parallel layer all-reduces its output in the forward. In the backward, the gradient of an input that
column-parallel layers share is all-reduced once, where it enters the attention, the MLP or the LM head
(`copy_to_tensor_parallel`): one all-reduce for q, k and v together and one for gate and up, as with Megatron's fused
projections, which the separate projections here avoid so that every tensor keeps the single model's name. So a
block costs two all-reduces of its activations in the forward and two in the backward; they run in the
activations' dtype (bf16 in training on GPUs). The LM head leaves the logits cut by vocabulary; the training loss
(pipeline_model.token_loss) fuses this rank's rows of the head with the cross-entropy and combines the per-token
statistics over the ranks (max, sum of exponentials and target logit all-reduced), so that the (tokens, vocab)
logits are never gathered, nor even made whole on one rank.

Every parallel layer is built from the full layer and keeps its shard of each full tensor; a sharded
parameter carries its `Shard` as `tp_shard` (how it is cut: to load a shard from a full tensor, to gather the full one
back for saving) and `tensor_model_parallel = True`, which DeepSpeed reads to count it on every rank when it
sums the global gradient norm (replicated parameters are counted on tensor-parallel rank 0 only).

In training the layers are cut on the meta device (pipeline/parallel/pipeline_model.py), so the full layer
costs no memory, and each rank then reads its shards from the starting model's file. Random numbers: the model
has no dropout, so the ranks of a group need no separate random streams. (Dropout inside a tensor-parallel region
would need a generator seeded per tensor-parallel rank.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline.model.config import ModelConfig
from pipeline.model.transformer import MLP, Attention, Block, Embedding, Head
from pipeline.parallel.tensor_parallel_fit import check_tensor_parallel


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward, all-reduce backward: where a replicated activation enters column-parallel layers,
    each rank's gradient covers its own shard only, and the sum is the full gradient."""

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
    """All-reduce forward, identity backward: partial results of every rank summed into the full one,
    whose gradient every rank already has whole."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromTensorParallel.apply(x, group)


@dataclass(frozen=True)
class Shard:
    """How a tensor-parallel rank's parameter is cut from the full tensor: along `dim`, whose `full_size`
    is padded with zeros to `world` equal parts, each a multiple of `multiple`."""

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
        return tuple(self.full_size if axis == self.dim else length for axis, length in enumerate(shape))

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
    # DeepSpeed (runtime/utils.py is_model_parallel_parameter): count this shard on every rank in the norm.
    parameter.tensor_model_parallel = True
    return parameter


def parameter_shards(module: nn.Module) -> dict[str, Shard]:
    """The Shard of each sharded parameter of `module`, by its state-dict name."""
    return {name: parameter.tp_shard for name, parameter in module.named_parameters(remove_duplicate=False)
            if hasattr(parameter, "tp_shard")}


class ColumnParallelLinear(nn.Module):
    """y_r = x W_r^T + b_r: this rank's output features (rows of the full weight). The input is replicated and has
    gone through `copy_to_tensor_parallel` once for all the layers that read it (the attention's q, k and v, the
    MLP's gate and up), whose backward sums its gradient over the ranks."""

    def __init__(self, full: nn.Linear, group) -> None:
        super().__init__()
        self.group = group
        shard = Shard(0, full.out_features, group)
        self.weight = _sharded(full.weight, shard)
        self.bias = _sharded(full.bias, shard) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b: this rank's input features (columns of the full weight), the input already
    cut the same way by a column-parallel layer; the bias is replicated and added once, after the sum."""

    def __init__(self, full: nn.Linear, group) -> None:
        super().__init__()
        self.group = group
        self.weight = _sharded(full.weight, Shard(1, full.in_features, group))
        self.bias = full.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tensor_parallel(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def _vocab_logits(hidden: torch.Tensor, weight: torch.Tensor, group) -> torch.Tensor:
    return F.linear(copy_to_tensor_parallel(hidden, group), weight)


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding; an id held by another rank looks up zeros here, and the sum over
    the ranks is the full lookup. `logits` uses the same shard as a tied LM head."""

    def __init__(self, full: nn.Embedding, group, multiple: int) -> None:
        super().__init__()
        self.group = group
        self.weight = _sharded(full.weight, Shard(0, full.num_embeddings, group, multiple))

    @property
    def vocab_start(self) -> int:
        return self.weight.tp_shard.start

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.vocab_start
        elsewhere = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        return reduce_from_tensor_parallel(rows.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.group)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary shard of the logits (padding ids included)."""
        return _vocab_logits(hidden, self.weight, self.group)


class VocabParallelHead(nn.Module):
    """An untied LM head cut by vocabulary: this rank's shard of the logits (padding ids included; the
    vocab-parallel cross-entropy leaves them out)."""

    def __init__(self, full: Head, group, multiple: int) -> None:
        super().__init__()
        self.group = group
        self.weight = _sharded(full.weight, Shard(0, full.out_features, group, multiple))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return _vocab_logits(hidden, self.weight, self.group)


class TensorParallelAttention(Attention):
    """Attention cut by heads: this rank's num_heads/tp query and num_kv_heads/tp key/value heads (so grouped-query
    attention stays within a rank), their ALiBi slopes, and the output projection's matching input columns."""

    def __init__(self, full: Attention, group) -> None:
        nn.Module.__init__(self)
        self.cfg = full.cfg
        self.group = group
        self.q, self.k, self.v = (ColumnParallelLinear(linear, group) for linear in (full.q, full.k, full.v))
        self.out = RowParallelLinear(full.out, group)
        heads = full.cfg.num_heads // dist.get_world_size(group)
        self.heads = slice(dist.get_rank(group) * heads, (dist.get_rank(group) + 1) * heads)

    def alibi_slopes(self, device: torch.device) -> torch.Tensor:
        return super().alibi_slopes(device)[self.heads]

    def forward(self, x: torch.Tensor, segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        return super().forward(copy_to_tensor_parallel(x, self.group), segment_ids)


class TensorParallelMLP(MLP):
    """The MLP cut by hidden units: this rank's columns of gate and up, the matching rows of down."""

    def __init__(self, full: MLP, group) -> None:
        nn.Module.__init__(self)
        self.group = group
        self.swiglu = full.swiglu
        if self.swiglu:
            self.gate = ColumnParallelLinear(full.gate, group)
        self.up = ColumnParallelLinear(full.up, group)
        self.down = RowParallelLinear(full.down, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(copy_to_tensor_parallel(x, self.group))


def apply_tensor_parallel(part: nn.Module, cfg: ModelConfig, group) -> nn.Module:
    """Make one part of the plain model tensor-parallel over `group`: a Block or an Embedding in place, a Head
    replaced (the returned module; use it instead of `part`); norms stay as they are (replicated)."""
    tp = dist.get_world_size(group)
    check_tensor_parallel(cfg, tp)
    if isinstance(part, Block):
        part.attn = TensorParallelAttention(part.attn, group)
        part.mlp = TensorParallelMLP(part.mlp, group)
    elif isinstance(part, Embedding):
        part.tokens = VocabParallelEmbedding(part.tokens, group, cfg.pad_vocab_multiple)
    elif isinstance(part, Head):
        return VocabParallelHead(part, group, cfg.pad_vocab_multiple)
    return part


def tensor_parallel_rank(modules: list[nn.Module]) -> Optional[int]:
    """This rank's place in the tensor-parallel group of the modules' shards (None if nothing is sharded)."""
    for module in modules:
        for shard in parameter_shards(module).values():
            return shard.rank
    return None
