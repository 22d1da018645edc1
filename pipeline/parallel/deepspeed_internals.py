"""The private parts of DeepSpeed that this project relies on, in one place.

DeepSpeed's PipelineModule keeps no public API for what pipeline_model.py needs: which layers this
pipeline stage holds, replacing one of them with its tensor-parallel form after DeepSpeed built it
(the tensor-parallel group exists only then), the tied embedding's module, and the topology's
groups. The training engine also overrides `PipelineModule._is_checkpointable` and, for layers built
on the meta device, `PipelineModule.to` and `_synchronize_tied_weights` during construction
(pipeline_model.TransformerPipeline), and reads `ds_pipe_replicated`, the mark DeepSpeed puts on a
tied layer's copy so that the global gradient norm counts it once. On a CPU, the training
engine keeps DeepSpeed from compiling its shared-memory collective
(`skip_cpu_shared_memory_collective`), and its held-out loss crosses the pipeline in one shape on
every stage (`broadcast_eval_loss_in_one_shape`); DeepSpeed's Muon optimizer, which ZeRO imports, is
imported without compiling its kernel (`import_muon_uncompiled`); in bf16 the ZeRO optimizer's
per-tensor overflow scan is left out where the gradient norm decides the same
(`leave_out_overflow_scan`), and that norm is taken in a few launches rather than two per tensor
(`grad_norm_in_few_launches`, which replaces ZeRO's `get_grad_norm_direct`); the leading rows of a
vocabulary matrix take scaled steps through ZeRO's map from a weight to its fp32 partition
(`scale_leading_row_steps`, `_hp_mapping`) and a wrapper around the step of the optimizer that ZeRO
drives; the pipeline's messages between stages go in a group of their own
(`pipeline_messages_in_their_own_group`, replacing `deepspeed.runtime.pipe.p2p`'s `send` and
`recv`). Checkpoints read and write ZeRO-1's partitions directly (`zero_partitions`,
`relink_zero_partitions`): its flat buffers' order and paddings, this rank's fp32 part and the base
optimizer's state of it, so that each rank reads only its own part of a checkpoint written in any
layout (ZeRO's own loading joins every rank's part on each rank).

Checked on DeepSpeed 0.19.8, hence the bound `deepspeed>=0.19.8,<0.20` in pyproject.toml: a later
DeepSpeed may rename any of these; the CPU tests (tests/unit/parallel/test_tensor_parallel.py,
tests/stages/test_pretrain.py) fail if one moved.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed import comm
from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
from deepspeed.runtime.utils import is_model_parallel_parameter
from torch import nn


def local_layer_indices(module) -> range:
    """The pipeline's layer indices that this stage holds."""
    return range(module._local_start, module._local_stop)


def local_layer(module, index: int):
    """This stage's callable for pipeline layer `index` (a module, or a partial function for a tied
    layer)."""
    return module.forward_funcs[index - module._local_start]


def tied_module(module, key: str) -> nn.Module:
    return module.tied_modules[key]


def replace_local_layer(module, old: nn.Module, new: nn.Module) -> None:
    """Run (and register the parameters of) `new` where this stage ran `old`."""
    position = module.forward_funcs.index(old)
    module.forward_funcs[position] = new
    setattr(module, str(module._local_start + position), new)


def slice_parallel_group(module):
    """The topology's tensor-parallel ("slice") process group of this rank."""
    return module._grid.get_slice_parallel_group()


def holds_first_layer(module) -> bool:
    return module._local_start == 0


def replicated_marks(layer: nn.Module) -> dict[str, bool]:
    """DeepSpeed's `ds_pipe_replicated` mark of each parameter (set on the last stage's copy of a
    tied layer)."""
    return {name: parameter.ds_pipe_replicated for name, parameter in layer.named_parameters()}


def restore_replicated_marks(layer: nn.Module, marks: dict[str, bool]) -> None:
    for name, parameter in layer.named_parameters():
        parameter.ds_pipe_replicated = marks[name]


def skip_cpu_shared_memory_collective() -> None:
    """Keep DeepSpeed's CPU backend on plain gloo. On first use it compiles a C++ shared-memory
    all-reduce (`deepspeed_shm_comm`) into ~/.cache/torch_extensions: minutes in silence, and a
    compiler the project does not otherwise need. Only DeepSpeed's inference all-reduce uses it;
    training's collectives go through gloo anyway. An op marked incompatible is DeepSpeed's own
    switch for "not built here, fall back"."""
    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def broadcast_eval_loss_in_one_shape(engine) -> None:
    """DeepSpeed's `eval_batch` broadcasts the last pipeline stage's loss, a 0-d tensor, into a
    1-element tensor on the other stages (`PipelineEngine._bcast_pipe_scalar`): the same bytes, but
    a collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL) sees shapes [] and [1] and stops the run.
    The source sends a 1-element tensor."""
    broadcast = engine._bcast_pipe_scalar

    def in_one_shape(data, src_rank=None, dtype=torch.float32):
        return broadcast(
            data.reshape(1) if data is not None else None, src_rank, dtype
        )  # None: not the source

    engine._bcast_pipe_scalar = in_one_shape


def pipeline_messages_in_their_own_group() -> None:
    """DeepSpeed's pipeline engine sends activations and gradients between stages with
    point-to-point calls on the world group (`deepspeed.runtime.pipe.p2p`), the group of its
    barriers too. gloo numbers every call on a group, point-to-point ones included, and a middle
    stage makes two where an end stage makes one (receive from the stage before, send to the one
    after, from the engine's start-up handshake on): with three stages or more, the collective check
    (TORCH_DISTRIBUTED_DEBUG=DETAIL) saw the world group's next barrier numbered 2 on a middle stage
    against 1 on the others and stopped a run whose ranks all made the same collectives. Sent in a
    group of their own (every rank), the messages leave the world group's numbering to its
    collectives, which the check compares. Every rank calls this before the engine starts (making a
    group is a collective)."""
    from deepspeed.runtime.pipe import p2p

    messages = torch.distributed.new_group()

    def send(tensor, dest_stage, async_op=False):
        assert not async_op, "DeepSpeed's pipeline sends synchronously"
        torch.distributed.send(
            tensor, p2p._grid.stage_to_global(stage_id=dest_stage), group=messages
        )

    def recv(tensor, src_stage, async_op=False):
        assert not async_op, "DeepSpeed's pipeline receives synchronously"
        torch.distributed.recv(
            tensor, p2p._grid.stage_to_global(stage_id=src_stage), group=messages
        )

    p2p.send, p2p.recv = send, recv


def import_muon_uncompiled() -> None:
    """DeepSpeed imports its Muon optimizer on the way of every ZeRO engine (the optimizer check at
    start, each gradient reduction), and that module compiles its Newton-Schulz kernel with
    torch.compile when imported, which imports torch._inductor: seconds of every rank's start (7 s
    on a 2-core CPU, 19% of a tp2 x pp2 warmup's CPU time in a profile). The training uses no Muon:
    the module is imported once here with TorchDynamo off (TORCHDYNAMO_DISABLE, which torch.compile
    reads at each call), its kernel left as plain PyTorch, and the variable is put back as it was."""
    previous = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")
    finally:
        if previous is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = previous


def leave_out_overflow_scan(engine) -> None:
    """In bf16 with `check_grad_overflow`, DeepSpeed's ZeRO optimizer first scans every gradient
    tensor for inf and NaN (`check_overflow`: amax, amin and six small launches per tensor, one
    after the other from the host), then computes the global gradient norm and also skips the step
    when that is not finite. A non-finite element makes the norm non-finite, on every rank (the norm
    is summed over the data- and model-parallel groups, as the scan's flag is), so while the norm is
    computed the scan decides nothing: for a 1.3B model it left the GPU idle for 88 ms of a 2.2 s
    step (one H100). In fp32 DeepSpeed runs no scan and relies on the norm alone."""
    optimizer = engine.optimizer
    if getattr(optimizer, "check_grad_overflow", False) and getattr(
        optimizer, "compute_grad_norm", False
    ):
        optimizer.check_overflow = lambda partition_gradients=True: None


def grad_norm_in_few_launches(engine) -> None:
    """DeepSpeed's ZeRO optimizer takes the global gradient norm (`get_grad_norm_direct`) a tensor
    at a time: each gradient copied to float64, then its norm, two launches per tensor issued from
    the host. For a 1.3B model that is 780 launches at the end of every step with the GPU waiting
    for them (one H100's trace). The replacement counts the same tensors (not the alignment padding,
    not a pipeline-replicated copy, the model-parallel ones on every rank and the others on
    model-parallel rank 0) and takes their norms with torch._foreach_norm (as
    torch.nn.utils.clip_grad_norm_ does), a few launches in all, each tensor's sum of squares in
    float32 and their total in float64; the reductions over the data- and model-parallel groups are
    DeepSpeed's, and a non-finite norm becomes DeepSpeed's -1, which skips the step."""
    optimizer = engine.optimizer
    own = getattr(optimizer, "get_grad_norm_direct", None)
    if own is None:
        return

    def grad_norm(gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return own(gradients, params, norm_type)
        unpadded = (g for g in gradients if not getattr(g, "_zero_padding", False))
        counted = [
            gradient.detach()
            for gradient, param in zip(unpadded, params)
            if not getattr(param, "ds_pipe_replicated", False)
            and (is_model_parallel_parameter(param) or optimizer.model_parallel_rank == 0)
        ]
        total = torch.zeros((), dtype=torch.float32, device=optimizer.device)
        if counted:
            norms = torch._foreach_norm(counted, 2, dtype=torch.float32)
            total = torch.stack(norms).to(torch.float64).square().sum().float()
        comm.all_reduce(total, op=comm.ReduceOp.SUM, group=optimizer.dp_process_group)
        optimizer._model_parallel_all_reduce(tensor=total, op=comm.ReduceOp.SUM)
        # DeepSpeed's sentinel for a norm that is not finite (its step then skips the update). Its
        # own helper makes the sentinel with torch.tensor on the device and fills with that tensor:
        # a blocking copy to the device and an .item(), each of which waits for the GPU's queue to
        # drain; a Python scalar needs neither.
        norm = total.sqrt()
        return norm.masked_fill_(~torch.isfinite(norm), -1.0)

    optimizer.get_grad_norm_direct = grad_norm


def scale_leading_row_steps(engine, matrices: list[nn.Parameter], rows: int, scale: float) -> None:
    """Each optimizer step moves the rows below the global id `rows` of `matrices` (vocabulary
    matrices; a tensor-parallel shard counts from its `tp_shard.start`) by `scale` times the step
    the optimizer computed: a learning rate of their own for part of a tensor, which param groups
    (whole tensors) cannot give. The step is scaled in ZeRO's fp32 partition, between the
    optimizer's update and ZeRO's copy back to the model's weights, so the master copy and the model
    agree. Adam's moments stay those of the unscaled step, as with a smaller learning rate (without
    weight decay, which matrices with such rows do not have, the two are the same update)."""
    optimizer = engine.optimizer.optimizer
    update = optimizer.step

    def leading_fragments() -> list[torch.Tensor]:
        # Looked up at every step: ZeRO links the partitions anew when it loads a checkpoint.
        fragments = []
        for matrix in matrices:
            mapping = getattr(matrix, "_hp_mapping", None)
            if mapping is None:  # this data-parallel rank's partition holds none of the matrix
                continue
            shard_start = matrix.tp_shard.start if hasattr(matrix, "tp_shard") else 0
            end = (
                min(max(rows - shard_start, 0), matrix.shape[0]) * matrix.shape[1]
            )  # in the flat matrix
            held = mapping.lp_fragment_address
            if end > held.start:
                fragments.append(
                    mapping.hp_fragment.narrow(0, 0, min(end, held.start + held.numel) - held.start)
                )
        return fragments

    def scaled_update(*args, **kwargs):
        fragments = leading_fragments()
        before = [fragment.clone() for fragment in fragments]
        result = update(*args, **kwargs)
        with torch.no_grad():  # the partitions are the optimizer's leaf tensors
            for fragment, old in zip(fragments, before):
                fragment.lerp_(old, 1.0 - scale)
        return result

    optimizer.step = scaled_update


@dataclass
class ZeroPartition:
    """One parameter group of ZeRO-1's optimizer as this rank holds it. The group's parameters,
    flattened in the order of `params` with `paddings[i]` zeros after parameter i (DeepSpeed's
    parameter alignment, off by default), make one flat vector of `total` elements; this rank owns
    its elements from `start` on, `held` of them (`master` is longer where the buffer's padding
    falls into this rank's part: the last rank's, and with a small group and many ranks, whole parts
    before it). `master` is the fp32 master copy of that part, `state` the base optimizer's
    state of it (empty before its first step)."""

    params: list[nn.Parameter]
    paddings: list[int]
    start: int
    master: torch.Tensor
    state: dict

    @property
    def total(self) -> int:
        return sum(param.numel() + padding for param, padding in zip(self.params, self.paddings))

    @property
    def held(self) -> int:
        return min(max(self.total - self.start, 0), self.master.numel())


def zero_partitions(optimizer) -> list[ZeroPartition]:
    """This rank's part of each parameter group of the engine's ZeRO-1 optimizer (stage_1_and_2:
    every rank's part is a data-parallel-th of the padded flat buffer)."""
    partitions = []
    for index, master in enumerate(optimizer.single_partition_of_fp32_groups):
        rank = dist.get_rank(group=optimizer.real_dp_process_group[index])
        partitions.append(
            ZeroPartition(
                params=list(optimizer.round_robin_bit16_groups[index]),
                paddings=list(optimizer.round_robin_bit16_padding[index]),
                start=rank * master.numel(),
                master=master,
                state=optimizer.optimizer.state[master],
            )
        )
    return partitions


def relink_zero_partitions(optimizer, step: int) -> None:
    """After the partitions' masters and states were written in place: the base optimizer's step
    count, and ZeRO's map from each weight to its part of the masters, as ZeRO's own loading ends."""
    for group in optimizer.optimizer.param_groups:
        group["step"] = step
    optimizer._link_all_hp_params()
