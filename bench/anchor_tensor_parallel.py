"""The tensor-parallel anchor of bench/train.py: bench/anchor_model.py's model cut over torchrun's
ranks by torch's own tensor parallelism (DTensor parameters, `parallelize_module`), to time our
stack's layouts of tp > 1 against what plain PyTorch does with the same GPUs.

The ranks form a DeviceMesh of (dp, tp), tp the inner dimension (neighbouring ranks, as NVLink
pairs them). Within a tensor-parallel group:
- attention: q, k and v column-parallel (`ColwiseParallel`), out row-parallel (`RowwiseParallel`).
  The model is built with three projections instead of its fused qkv (`fused_qkv=False`): cutting
  the fused [q | k | v] output by columns would give rank 0 all of q and rank 1 k and v. Cut apart,
  rank r gets query heads r*H/tp .. (r+1)*H/tp - 1 and key/value heads r*KV/tp .. (r+1)*KV/tp - 1,
  which are the ones grouped-query attention pairs them with (query head h reads key/value head
  h // (H/KV)); the ALiBi model's slopes are cut the same way;
- MLP: gate and up column-parallel, down row-parallel;
- embedding and tied LM head: vocab-parallel, as ours. The embedding is `RowwiseParallel` (each
  rank holds padded_vocab/tp rows, its output summed over the ranks); the head multiplies by the same
  DTensor, which leaves the logits cut by vocabulary, and the loss runs under `loss_parallel` (the
  cross-entropy's max and sum of exponentials all-reduced), so that no rank makes all the logits. The
  vocabulary's padding columns get -inf, so that they weigh nothing in the softmax (the single
  anchor cuts them off instead, which would gather the logits here);
- norms and the residual stream between the layers (plain tensors): replicated without sequence
  parallelism (norm weights as replicated DTensors, so that every parameter is a DTensor: torch's
  clip_grad_norm_ and AdamW take them in one list; their gradients come out as partial sums over the
  ranks, which DTensor sums where clipping and AdamW read them); with it (`+sp`),
  `SequenceParallel`: the residual stream and the norms on each rank's part of the sequence
  (Shard(1)), and the row-parallel layers and the embedding reduce-scatter instead of all-reducing. A norm before column-parallel layers hands them its output
  made whole (`PrepareModuleOutput`: one all-gather for q, k and v together, and one for gate and
  up), so that their gradients are summed into one reduce-scatter in the backward. (Without sequence
  parallelism the same holds with all-reduces: the norm's output is one replicated DTensor that q, k
  and v share.)

Across the data-parallel replicas (dp > 1) each rank trains its share of the rows, and after the
last micro-batch its gradients are averaged over the mesh's dp dimension by explicit all-reduces,
before clipping. That is the simplest correct choice, and it is what our engine does too: DeepSpeed's
pipeline engine reduces the gradients once after the last micro-batch, not during the backward.
FSDP2 (`fully_shard`) would shard the weights as well (ZeRO-3, where ours is ZeRO-1), and DDP-style
`replicate` reduces during every micro-batch's backward unless told not to.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from bench.anchor_model import AnchorModel
from pipeline.model.model_config import uneven_for_tensor_parallel


def anchor_mesh(device: torch.device, tp: int, dp: int) -> DeviceMesh:
    """The (dp, tp) mesh of torchrun's ranks, over the process group started before."""
    return init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))


def parallelize_anchor(model: AnchorModel, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Cut `model` (built with fused_qkv=False, its weights loaded) over the mesh's tp dimension, in
    place."""
    tp_mesh = mesh["tp"]
    tp, cfg = tp_mesh.size(), model.cfg
    # The flags that set each size (uneven_for_tensor_parallel names the config keys).
    flags = {"num_heads": "--heads", "num_kv_heads": "--kv-heads", "ffn_size": "--ffn"}
    uneven = [f"{flags[key]} {getattr(cfg, key)}" for key in uneven_for_tensor_parallel(cfg, tp)]
    if cfg.padded_vocab_size % tp:
        uneven.append(f"the padded vocabulary {cfg.padded_vocab_size}")
    if uneven:
        raise ValueError(
            f"tp {tp} does not divide {', '.join(uneven)}: each rank takes an equal share; "
            "choose layouts in --layouts whose tp divides them"
        )
    # The residual stream: each rank's copy of it, or with sequence parallelism its part of the
    # sequence, as plain tensors between the layers (the row-parallel layers' and the embedding's
    # outputs, reduced: all-reduce, or reduce-scatter).
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "blocks.*.q": ColwiseParallel(),
        "blocks.*.k": ColwiseParallel(),
        "blocks.*.v": ColwiseParallel(),
        "blocks.*.out": RowwiseParallel(output_layouts=residual),
        "blocks.*.up": ColwiseParallel(),
        "blocks.*.down": RowwiseParallel(output_layouts=residual),
    }
    if cfg.activation == "swiglu":
        plan["blocks.*.gate"] = ColwiseParallel()
    parallelize_module(model, tp_mesh, plan)
    # RowwiseParallel hands the embedding's output on as an AsyncCollectiveTensor (its all-reduce
    # or reduce-scatter waited for at first use), and a compiled block given one returned no
    # gradient for it (torch 2.13, aot_eager and inductor): copied here, it reaches the block as a
    # plain tensor.
    model.embed.register_forward_hook(lambda module, inputs, output: output.clone())
    # The norms: replicated weights (DTensors, as every parameter then is) on the residual stream.
    # One that column-parallel layers read hands them one replicated DTensor (with sequence
    # parallelism made whole by one all-gather), which q, k and v (gate and up) share, so that their
    # gradients are reduced once; the embedding's norm (ALiBi model) hands its output back to the
    # residual stream.
    norms = [norm for block in model.blocks for norm in (block.attn_norm, block.mlp_norm)]
    norms += [model.final_norm] + ([model.embed_norm] if cfg.embedding_norm else [])
    whole = PrepareModuleOutput(
        output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=False
    )
    for norm in norms:
        to_residual = norm is model.embed_norm
        if sequence_parallel:
            parallelize_module(norm, tp_mesh, SequenceParallel(use_local_output=to_residual))
            if not to_residual:
                parallelize_module(norm, tp_mesh, whole)
        else:
            distribute_module(
                norm, tp_mesh, input_fn=_replicated, output_fn=_local if to_residual else None
            )
    if cfg.position == "alibi":
        for block in model.blocks:
            block.slopes = block.slopes.chunk(tp)[tp_mesh.get_local_rank()]


def _replicated(module: nn.Module, inputs: tuple[torch.Tensor], mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(inputs[0], mesh, [Replicate()], run_check=False)


def _local(module: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
    return output.to_local()


def vocab_parallel_logits(
    model: AnchorModel, mesh: DeviceMesh
) -> Callable[[torch.Tensor, torch.Tensor | None], DTensor]:
    """logits(input ids, segment ids): the tied head's logits cut by vocabulary over the tp
    dimension, the padding columns at -inf; the cross-entropy of them runs under `loss_parallel`."""
    cfg = model.cfg
    padding = torch.zeros(cfg.padded_vocab_size, device=model.embed.weight.device)
    padding[cfg.vocab_size :] = float("-inf")
    padding = distribute_tensor(padding, mesh["tp"], [Shard(0)])

    def logits(input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> DTensor:
        cut = F.linear(model.hidden_states(input_ids, segment_ids), model.embed.weight)
        return cut + padding if cfg.padded_vocab_size > cfg.vocab_size else cut

    return logits


def gradient_averaging(parameters: list[nn.Parameter], mesh: DeviceMesh) -> Callable[[], None]:
    """average(): each gradient (a DTensor: this rank's share of it) averaged over the mesh's dp
    dimension, all tensors' all-reduces in flight together."""
    group, replicas = mesh.get_group("dp"), mesh["dp"].size()

    def average() -> None:
        with torch.no_grad():  # to_local() then returns the gradient's own storage
            local = [p.grad.to_local() for p in parameters]
            # Divided first, then summed: gloo has no ReduceOp.AVG.
            works = [
                dist.all_reduce(grad.div_(replicas), group=group, async_op=True) for grad in local
            ]
            for work in works:
                work.wait()

    return average
