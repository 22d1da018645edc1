"""The transformer as DeepSpeed pipeline layers: embedding, blocks, final norm, head.

Between stages an activation is `hidden` or `(hidden, segment_ids)`; the first layer takes the token
ids (or `(token_ids, segment_ids)`). Within a stage run without activation checkpointing, a block
hands the next layer its MLP's output unadded (`Owed`), which that layer adds inside its first norm;
the stage's last block adds it itself, so that what crosses stages and checkpoints is one tensor.
With tied embeddings the embedding is a TiedLayerSpec on the first and the last stage, and DeepSpeed
sums the two stages' gradients of the shared matrix. Layer i of the pipeline holds the Transformer's
module `LAYER_PREFIXES(i)`, so a stage's weights load from (and save to) the single-model names of a
safetensors file.

The last layer hands the hidden states and the head's weight to the loss, which fuses the LM head
with the cross-entropy chunk by chunk (`token_loss`). With a tensor-parallel topology (parallel.tp >
1) each stage's layers are cut over the topology's tensor-slicing group
(`pipeline/parallel/tensor_parallel.py`), and the loss works on this rank's vocabulary rows of the
head.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from pipeline.kernels import VocabShard, linear_cross_entropy
from pipeline.model.model_config import ModelConfig
from pipeline.model.transformer import Block, Embedding, Head, LayerNorm, RMSNorm
from pipeline.parallel.deepspeed_internals import (
    local_layer,
    local_layer_indices,
    replace_local_layer,
    replicated_marks,
    restore_replicated_marks,
    slice_parallel_group,
    tied_module,
)
from pipeline.parallel.tensor_parallel import (
    SequenceParallelLayerNorm,
    SequenceParallelRMSNorm,
    VocabParallelEmbedding,
    VocabParallelHead,
    apply_tensor_parallel,
)

TIED_KEY = "embedding"


def _split(inputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    return (inputs[0], inputs[1]) if isinstance(inputs, tuple) else (inputs, None)


def _join(hidden: torch.Tensor, segment_ids: Optional[torch.Tensor]):
    return hidden if segment_ids is None else (hidden, segment_ids)


@dataclass(frozen=True)
class Owed:
    """A block's output within a stage: the residual stream, and the MLP's output still to be added
    to it."""

    hidden: torch.Tensor
    addend: torch.Tensor
    segment_ids: Optional[torch.Tensor]


class EmbeddingLayer(Embedding):
    def forward(self, inputs):
        token_ids, segment_ids = _split(inputs)
        return _join(super().forward(token_ids), segment_ids)


class BlockLayer(Block):
    # Set by pipeline_module where the next layer runs on this stage and no checkpoint starts
    # between them.
    hands_on_owed = False

    def forward(self, inputs):
        if isinstance(inputs, Owed):
            hidden, owed, segment_ids = inputs.hidden, inputs.addend, inputs.segment_ids
        else:
            (hidden, segment_ids), owed = _split(inputs), None
        hidden, mlp_out = self.residual_parts(hidden, segment_ids, owed)
        if self.hands_on_owed:
            return Owed(hidden, mlp_out, segment_ids)
        return _join(hidden + mlp_out, segment_ids)


class _FinalNorm:
    """The final norm as a pipeline layer (before RMSNorm or LayerNorm in the bases): it adds the
    last block's owed output inside the norm. Document boundaries end here: the head and the loss
    look at each token alone."""

    def forward(self, inputs):
        if isinstance(inputs, Owed):
            return self.add_forward(inputs.hidden, inputs.addend)[1]
        return super().forward(_split(inputs)[0])


class FinalRMSNormLayer(_FinalNorm, RMSNorm):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.norm_eps, cfg.norm_unit_offset)


class FinalLayerNormLayer(_FinalNorm, LayerNorm):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


class SequenceParallelFinalRMSNormLayer(FinalRMSNormLayer, SequenceParallelRMSNorm):
    """The final RMSNorm on this rank's part of the sequence (parallel.sequence_parallel)."""

    __init__ = SequenceParallelRMSNorm.__init__


class SequenceParallelFinalLayerNormLayer(FinalLayerNormLayer, SequenceParallelLayerNorm):
    """The final LayerNorm on this rank's part of the sequence (parallel.sequence_parallel)."""

    __init__ = SequenceParallelLayerNorm.__init__


class HeadLayer(Head):
    """The LM head as the pipeline's last layer: it hands the hidden states and its weight to the
    loss, which applies the head fused with the cross-entropy (the (tokens, vocabulary) logits never
    exist whole)."""

    def forward(self, hidden: torch.Tensor):
        return hidden, self.weight


class ParallelHeadLayer(VocabParallelHead):
    """HeadLayer cut by vocabulary over the tensor-parallel group: this rank's rows of the weight;
    the hidden states' gradient is summed over the group in the backward (with sequence parallelism,
    the hidden states are gathered from the ranks' parts of the sequence first)."""

    def forward(self, hidden: torch.Tensor):
        return self.enter(hidden), self.weight


def _tied_head(embedding: EmbeddingLayer, hidden: torch.Tensor):
    if isinstance(embedding.tokens, VocabParallelEmbedding):
        return embedding.tokens.enter(hidden), embedding.tokens.weight
    return hidden, embedding.tokens.weight


# The label of a position that is not scored (linear_cross_entropy's ignore_index).
IGNORE = -100


def token_loss(vocab_size: int, group=None, softcap: Optional[float] = None) -> TokenLoss:
    """The cross-entropy of the next tokens, the LM head fused into it
    (pipeline.kernels.linear_cross_entropy), summed over the labels that count (not -100) and
    divided by all labels: the mean in training, where every label counts; in held-out scoring,
    where context and padding do not, the engine's mean over micro-batches times their labels is the
    exact sum (pipeline/training/heldout.py). Under tensor parallelism from this rank's vocabulary
    shard of the head, the per-token statistics combined over the group. The padded vocabulary rows
    are never predicted; `softcap` caps the logits first (model.logit_softcap)."""
    return TokenLoss(vocab_size, group, softcap)


class TokenLoss:
    """token_loss's loss. Inside `scoring_runs` it also sums the NLL of each run of scored labels
    (consecutive labels that count) of each row on its own, and hands those sums on: the in-loop
    downstream tasks pack one (prompt, choice) pair a run (pipeline/training/inloop_tasks.py). Each
    run is its own linear_cross_entropy call, so that the tensor-parallel ranks, which see the same
    labels, make the same calls and collectives."""

    def __init__(self, vocab_size: int, group=None, softcap: Optional[float] = None) -> None:
        self.vocab_size, self.group, self.softcap = vocab_size, group, softcap
        self.runs: Optional[list[torch.Tensor]] = None  # a list while scoring_runs is active

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        dist.all_reduce(
            tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.group
        )

    def __call__(self, outputs, labels: torch.Tensor) -> torch.Tensor:
        hidden, weight = outputs
        shard = None
        if self.group is not None:
            # The whole shard's rows, padding included, pick the chunks: equal on every rank, as
            # they must be.
            start = dist.get_rank(self.group) * weight.shape[0]
            shard = VocabShard(start, weight.shape[0], self._all_reduce)
            weight = weight[: min(weight.shape[0], max(0, self.vocab_size - start))]
        else:
            weight = weight[: self.vocab_size]
        if self.runs is not None:
            sums = self._run_sums(hidden, weight, labels, shard)
            self.runs.append(sums)
            return sums.sum() / labels.numel()
        summed = linear_cross_entropy(
            hidden, weight, labels, reduction="sum", shard=shard, softcap=self.softcap
        )
        return summed / labels.numel()

    def _run_sums(self, hidden, weight, labels: torch.Tensor, shard) -> torch.Tensor:
        """The summed NLL of each run of scored labels, row by row, float32 (runs,)."""
        scored = (labels != IGNORE).to(torch.int8).cpu()
        edge = torch.zeros((scored.shape[0], 1), dtype=torch.int8)
        # +1 where a run begins, -1 one past where it ends
        steps = torch.diff(scored, dim=1, prepend=edge, append=edge)
        sums = []
        for row in range(labels.shape[0]):
            bounds = steps[row].nonzero().flatten().tolist()
            for begin, end in zip(bounds[::2], bounds[1::2]):
                sums.append(
                    linear_cross_entropy(
                        hidden[row, begin:end],
                        weight,
                        labels[row, begin:end],
                        reduction="sum",
                        shard=shard,
                        softcap=self.softcap,
                    )
                )
        if not sums:
            return torch.zeros(0, dtype=torch.float32, device=hidden.device)
        return torch.stack(sums).float()

    @contextmanager
    def scoring_runs(self) -> Iterator[list[torch.Tensor]]:
        """While inside, each call appends its runs' sums (one tensor per micro-batch) to the list
        yielded, and returns their total over all labels as usual."""
        self.runs = []
        try:
            yield self.runs
        finally:
            self.runs = None


class _BuiltOnMeta:
    """A layer spec whose layer is built on the meta device: shapes without memory, until the engine
    materialises this rank's share (after the tensor-parallel cut) and loads it from the starting
    model's file."""

    def build(self, log: bool = False):
        with torch.device("meta"):
            return super().build(log=log)


class MetaLayerSpec(_BuiltOnMeta, LayerSpec):
    pass


class MetaTiedLayerSpec(_BuiltOnMeta, TiedLayerSpec):
    pass


class TransformerPipeline(PipelineModule):
    """DeepSpeed's PipelineModule over layers built on the meta device, whose activation
    checkpointing recomputes transformer blocks only. It overrides the private `_is_checkpointable`
    and `_synchronize_tied_weights` (pipeline/parallel/deepspeed_internals.py lists what else is
    private).

    DeepSpeed would also wrap the embedding, whose input (token ids) needs no gradient: a reentrant
    checkpoint around it then drops its parameters' gradients, and training silently goes wrong.

    DeepSpeed's constructor moves the module to the device and broadcasts the tied embedding from
    the first stage to the last; on meta tensors both wait for `materialise`, after which every
    stage has loaded the same tied matrix from the same file, so there is nothing to broadcast.
    """

    def _is_checkpointable(self, funcs) -> bool:
        return all(isinstance(func, BlockLayer) for func in funcs)

    def _on_meta(self) -> bool:
        return any(parameter.is_meta for parameter in self.parameters())

    def to(self, *args, **kwargs):
        return self if self._on_meta() else super().to(*args, **kwargs)

    def _synchronize_tied_weights(self) -> None:
        if not self._on_meta():
            super()._synchronize_tied_weights()

    def materialise(self, device: torch.device) -> None:
        """Allocate this rank's parameters on `device`, uninitialised: the caller loads every one of
        them. New Parameter objects keep the old ones' attributes (`tp_shard`, DeepSpeed's marks),
        which `to_empty` drops."""
        made: dict[int, nn.Parameter] = {}
        for module in self.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                if not parameter.is_meta:
                    continue
                if id(parameter) not in made:  # a shared parameter stays shared
                    new = nn.Parameter(
                        torch.empty_like(parameter, device=device),
                        requires_grad=parameter.requires_grad,
                    )
                    new.__dict__.update(parameter.__dict__)
                    made[id(parameter)] = new
                setattr(module, name, made[id(parameter)])
        left = [name for name, tensor in self.state_dict().items() if tensor.is_meta]
        if left:
            raise RuntimeError(
                f"pipeline stage {self.stage_id}: {', '.join(left)} still on the meta device after "
                f"materialise (a buffer? build it in forward, or load it)"
            )


def layer_prefixes(cfg: ModelConfig) -> list[str]:
    """The Transformer's name of each pipeline layer (its state-dict prefix)."""
    head = "embedding." if cfg.tie_embeddings else "head."
    return ["embedding.", *(f"blocks.{i}." for i in range(cfg.num_layers)), "final_norm.", head]


def pipeline_module(
    cfg: ModelConfig,
    num_stages: int,
    topology=None,
    partition_method: str = "type:BlockLayer",
    checkpoint_interval: int = 0,
    sequence_parallel: bool = False,
) -> PipelineModule:
    """The model split into `num_stages` stages (blocks spread evenly: `type:BlockLayer`), each
    stage's layers tensor-parallel when the topology's `model` axis is > 1 (with
    `sequence_parallel`, on sequence parts between them). Its parameters are on the meta device:
    `materialise`, then load them (pipeline/training/weights.py), so that a rank never holds more
    than its share."""
    if cfg.tie_embeddings:
        first = MetaTiedLayerSpec(TIED_KEY, EmbeddingLayer, cfg, tied_weight_attr="tokens.weight")
        last = MetaTiedLayerSpec(
            TIED_KEY, EmbeddingLayer, cfg, forward_fn=_tied_head, tied_weight_attr="tokens.weight"
        )
    else:
        first, last = MetaLayerSpec(EmbeddingLayer, cfg), MetaLayerSpec(HeadLayer, cfg)
    final_norm = FinalRMSNormLayer if cfg.norm == "rmsnorm" else FinalLayerNormLayer
    layers = [
        first,
        *(MetaLayerSpec(BlockLayer, cfg, layer) for layer in range(cfg.num_layers)),
        MetaLayerSpec(final_norm, cfg),
        last,
    ]
    kwargs = {"topology": topology} if topology is not None else {"num_stages": num_stages}
    module = TransformerPipeline(
        layers=layers,
        loss_fn=token_loss(cfg.vocab_size, softcap=cfg.logit_softcap),
        partition_method=partition_method,
        activation_checkpoint_interval=checkpoint_interval,
        **kwargs,
    )
    group = slice_parallel_group(module)
    if dist.get_world_size(group) > 1:
        _tensor_parallel_stage(module, cfg, group, sequence_parallel)
        module.loss_fn = token_loss(cfg.vocab_size, group, cfg.logit_softcap)
    if checkpoint_interval == 0:
        # A checkpoint would save the owed output too, and a stage's output crosses to the next
        # stage: there the block adds it itself.
        blocks = [layer for _, layer in local_layers(module, cfg) if isinstance(layer, BlockLayer)]
        last_here = local_layer(module, local_layer_indices(module)[-1])
        for block in blocks:
            block.hands_on_owed = block is not last_here
    return module


def _tensor_parallel_stage(
    module: PipelineModule, cfg: ModelConfig, group, sequence_parallel: bool
) -> None:
    """Cut this stage's layers over the tensor-parallel group, after DeepSpeed has built them (the
    group exists only then) and before its engine sees the parameters."""
    for _, layer in local_layers(module, cfg):
        # DeepSpeed marked the last stage's copy of a tied embedding as replicated (counted once in
        # the gradient norm); its shards keep the mark.
        marks = replicated_marks(layer)
        if isinstance(layer, HeadLayer):
            parallel = ParallelHeadLayer(layer, group, cfg.pad_vocab_multiple, sequence_parallel)
        elif sequence_parallel and isinstance(layer, FinalRMSNormLayer):
            parallel = SequenceParallelFinalRMSNormLayer(layer, group)
        elif sequence_parallel and isinstance(layer, FinalLayerNormLayer):
            parallel = SequenceParallelFinalLayerNormLayer(layer, group)
        else:
            parallel = apply_tensor_parallel(layer, cfg, group, sequence_parallel)
        restore_replicated_marks(parallel, marks)
        if parallel is not layer:  # the untied head, the final norm
            replace_local_layer(module, layer, parallel)


def local_layers(module: PipelineModule, cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    """This stage's layers with their Transformer prefixes (a tied embedding appears once per
    stage)."""
    prefixes = layer_prefixes(cfg)
    found, seen = [], set()
    for index in local_layer_indices(module):
        layer = local_layer(module, index)
        if not isinstance(layer, nn.Module):  # a tied layer runs through a partial function
            layer = tied_module(module, TIED_KEY)
        if id(layer) not in seen:
            seen.add(id(layer))
            found.append((prefixes[index], layer))
    return found
