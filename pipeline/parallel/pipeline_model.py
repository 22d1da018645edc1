"""The transformer as DeepSpeed pipeline layers: embedding, blocks, final norm, head.

Between stages an activation is `hidden` or `(hidden, segment_ids)`; the first layer takes the token ids
(or `(token_ids, segment_ids)`). With tied embeddings the embedding is a TiedLayerSpec on the first and the
last stage, and DeepSpeed sums the two stages' gradients of the shared matrix. Layer i of the pipeline
holds the Transformer's module `LAYER_PREFIXES(i)`, so a stage's weights load from (and save to) the
single-model names of a safetensors file.

With a tensor-parallel topology (parallel.tp > 1) each stage's layers are cut over the topology's
tensor-slicing group (`pipeline/parallel/tensor_parallel.py`), the head gives each rank its vocabulary shard
of the logits, and the loss is the vocab-parallel cross-entropy.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from pipeline.model.config import ModelConfig
from pipeline.parallel.deepspeed_internals import (local_layer, local_layer_indices, replace_local_layer,
                                                  replicated_marks, restore_replicated_marks, slice_parallel_group,
                                                  tied_module)
from pipeline.model.transformer import Block, Embedding, Head, LayerNorm, RMSNorm
from pipeline.parallel.tensor_parallel import (VocabParallelEmbedding, apply_tensor_parallel,
                                               vocab_parallel_cross_entropy)

TIED_KEY = "embedding"


def _split(inputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    return (inputs[0], inputs[1]) if isinstance(inputs, tuple) else (inputs, None)


def _join(hidden: torch.Tensor, segment_ids: Optional[torch.Tensor]):
    return hidden if segment_ids is None else (hidden, segment_ids)


class EmbeddingLayer(Embedding):
    def forward(self, inputs):
        token_ids, segment_ids = _split(inputs)
        return _join(super().forward(token_ids), segment_ids)


class BlockLayer(Block):
    def forward(self, inputs):
        hidden, segment_ids = _split(inputs)
        return _join(super().forward(hidden, segment_ids), segment_ids)


class FinalRMSNormLayer(RMSNorm):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.norm_eps)

    def forward(self, inputs):
        # Document boundaries end here: the head and the loss look at each token alone.
        return super().forward(_split(inputs)[0])


class FinalLayerNormLayer(LayerNorm):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)

    def forward(self, inputs):
        return super().forward(_split(inputs)[0])


class HeadLayer(Head):
    pass


def _tied_head(embedding: EmbeddingLayer, hidden: torch.Tensor) -> torch.Tensor:
    if isinstance(embedding.tokens, VocabParallelEmbedding):
        return embedding.tokens.logits(hidden)
    return F.linear(hidden, embedding.tokens.weight)


def token_loss(vocab_size: int, group=None) -> Callable:
    """The cross-entropy of the next tokens summed over the labels that count (not -100) and divided by all labels:
    the mean in training, where every label counts; in held-out scoring, where context and padding do not, the
    engine's mean over micro-batches times their labels is the exact sum (pipeline/training/heldout.py). Under
    tensor parallelism, from vocabulary shards of the logits."""
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # The padded vocabulary rows are never predicted.
        summed = F.cross_entropy(logits[..., :vocab_size].float().flatten(0, 1), labels.flatten(), reduction="sum")
        return summed / labels.numel()

    def parallel_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits.float(), labels, vocab_size, group, reduction="sum") / labels.numel()
    return loss if group is None else parallel_loss


class TransformerPipeline(PipelineModule):
    """DeepSpeed's PipelineModule whose activation checkpointing recomputes transformer blocks only (it overrides
    the private `_is_checkpointable`: pipeline/parallel/deepspeed_internals.py lists what else is private).

    DeepSpeed would also wrap the embedding, whose input (token ids) needs no gradient: a reentrant
    checkpoint around it then drops its parameters' gradients, and training silently goes wrong.
    """

    def _is_checkpointable(self, funcs) -> bool:
        return all(isinstance(func, BlockLayer) for func in funcs)


def layer_prefixes(cfg: ModelConfig) -> list[str]:
    """The Transformer's name of each pipeline layer (its state-dict prefix)."""
    head = "embedding." if cfg.tie_embeddings else "head."
    return ["embedding.", *(f"blocks.{i}." for i in range(cfg.num_layers)), "final_norm.", head]


def pipeline_module(cfg: ModelConfig, num_stages: int, topology=None, partition_method: str = "type:BlockLayer",
                    checkpoint_interval: int = 0) -> PipelineModule:
    """The model split into `num_stages` stages (blocks spread evenly: `type:BlockLayer`), each stage's layers
    tensor-parallel when the topology's `model` axis is > 1."""
    if cfg.tie_embeddings:
        first = TiedLayerSpec(TIED_KEY, EmbeddingLayer, cfg, tied_weight_attr="tokens.weight")
        last = TiedLayerSpec(TIED_KEY, EmbeddingLayer, cfg, forward_fn=_tied_head, tied_weight_attr="tokens.weight")
    else:
        first, last = LayerSpec(EmbeddingLayer, cfg), LayerSpec(HeadLayer, cfg)
    final_norm = FinalRMSNormLayer if cfg.norm == "rmsnorm" else FinalLayerNormLayer
    layers = [first, *(LayerSpec(BlockLayer, cfg) for _ in range(cfg.num_layers)), LayerSpec(final_norm, cfg), last]
    kwargs = {"topology": topology} if topology is not None else {"num_stages": num_stages}
    module = TransformerPipeline(layers=layers, loss_fn=token_loss(cfg.vocab_size), partition_method=partition_method,
                            activation_checkpoint_interval=checkpoint_interval, **kwargs)
    group = slice_parallel_group(module)
    if dist.get_world_size(group) > 1:
        _tensor_parallel_stage(module, cfg, group)
    return module


def _tensor_parallel_stage(module: PipelineModule, cfg: ModelConfig, group) -> None:
    """Cut this stage's layers over the tensor-parallel group, after DeepSpeed has built them (the group
    exists only then) and before its engine sees the parameters."""
    for _, layer in local_layers(module, cfg):
        # DeepSpeed marked the last stage's copy of a tied embedding as replicated (counted once in the
        # gradient norm); its shards keep the mark.
        marks = replicated_marks(layer)
        parallel = apply_tensor_parallel(layer, cfg, group)
        restore_replicated_marks(parallel, marks)
        if parallel is not layer:  # the untied head
            replace_local_layer(module, layer, parallel)
    module.loss_fn = token_loss(cfg.vocab_size, group)


def local_layers(module: PipelineModule, cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    """This stage's layers with their Transformer prefixes (a tied embedding appears once per stage)."""
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
