"""Training checkpoints: everything to continue a run exactly, written so that a kill never leaves
one that looks complete, and readable in another layout (tensor, pipeline and data parallelism).

A checkpoint is a folder `checkpoints/step-00001000/`:
- `model-pp{p}-tp{t}.safetensors`: each pipeline stage's (and tensor-parallel shard's) own weights,
  written by its first data-parallel replica;
- `optim-pp{p}-tp{t}-dp{d}.safetensors`: that rank's part of ZeRO-1's flat fp32 master weights and of
  Adam's moments, without padding, so that the parts of a stage's ranks joined in order are its flat
  optimizer groups;
- `layout-pp{p}-tp{t}.json`: how that share is cut from the single model and laid out in the flat
  groups (pipeline/training/checkpoint_shards.py), so that a rank of any other layout finds its own
  share in the files: a run resumes with other parallel.tp, parallel.pp or parallel.dp;
- `rng-rank{r}.safetensors`: the random-number generator states (restored in the same layout);
- `state.json`, written last: the step, the layout, the learning-rate schedule, the sampler's state,
  the run's counters, and the size and SHA-256 of every other file
  (pipeline/training/checkpoint_files.py). Nothing is unpickled: tensors are safetensors, the rest
  JSON. All ranks write into `.step-00001000.tmp/`; rank 0 renames it into place once every rank has
  finished, so a checkpoint cut short while being written is never seen. A resume takes the newest
  checkpoint that verifies (`choose`): one damaged later (a full quota, a file-system incident) is
  skipped, saying why, for the one before. Only the newest `keep` checkpoints are kept.

The learning-rate schedule is a function of the step and of `train.steps`: a resumed run restores
the step and takes the rate of the schedule it is configured with now, so a run continued with a
larger `train.steps` stretches its decay over the new total from the checkpoint's step on.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from pipeline.commit_steps import commit_step
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
from pipeline.parallel.deepspeed_internals import (
    ZeroPartition,
    relink_zero_partitions,
    zero_partitions,
)
from pipeline.parallel.tensor_parallel import parameter_shards
from pipeline.tensor_files import save_tensors
from pipeline.training.checkpoint_files import (
    FILES_KEY,
    STATE_FILE,
    checkpoint_dir,
    checkpoints,
    checksum_problem,
    file_entry,
    read_state,
    size_problem,
)
from pipeline.training.checkpoint_shards import (
    LAYOUT_FILE,
    MASTER,
    MODEL_FILE,
    OPTIMIZER_FILE,
    SavedShards,
    describe_stage,
    parameter_names,
)
from pipeline.training.engine import Engine

log = logging.getLogger(__name__)

# Each rank's list of the files it wrote, joined into state.json by rank 0.
_RANK_FILES = "files-rank{rank}.json"


RESTART_REMEDY = "Start again with resume=never, which moves this interrupted run aside."


def choose(root: Path, device, remedy: str = RESTART_REMEDY) -> Optional[Path]:
    """The newest checkpoint under `root` that verifies, or None if there is none (a collective:
    every rank checks the sizes, and the checksums of its share of the files). Raises StageError
    when there are checkpoints but none verifies, ending with `remedy`: starting again would throw
    them away, which only `resume=never` does."""
    rank, world = dist.get_rank(), dist.get_world_size()
    found = checkpoints(root)
    for folder in found:
        problem = size_problem(folder)
        if problem is None:
            names = sorted(read_state(folder)[FILES_KEY])
            problem = checksum_problem(folder, names[rank::world])
        failed = torch.zeros(world, device=device)
        failed[rank] = problem is not None
        dist.all_reduce(failed)
        if not failed.any():
            return folder
        if problem is not None:
            log.warning("Skipping checkpoint %s: %s.", folder, problem)
        elif rank == 0:
            log.warning(
                "Skipping checkpoint %s: a file failed its checksum on rank(s) %s (see their logs).",
                folder,
                failed.nonzero().flatten().tolist(),
            )
    if found:
        raise StageError(
            f"None of the checkpoints in {root} verifies (see the messages above), so the run "
            f"cannot continue. {remedy}"
        )
    return None


def _coordinates(engine: Engine) -> tuple[int, int, int]:
    grid = engine.engine.grid
    return grid.get_pipe_parallel_rank(), grid.get_slice_parallel_rank(), engine.dp_rank


def _optimizer_tensors(partitions: list[ZeroPartition]) -> dict[str, torch.Tensor]:
    """This rank's part of each flat optimizer group, its padding left out: the fp32 master copy
    (`fp32.{group}`) and each state (`state.{group}.{key}`)."""
    tensors = {}
    for group, part in enumerate(partitions):
        tensors[f"fp32.{group}"] = part.master[: part.held].detach().cpu().contiguous()
        for key, value in part.state.items():
            tensor = torch.as_tensor(value).detach().cpu()
            # Adam's step, a scalar as Adam keeps it: a resumed run writes the bytes an
            # uninterrupted one writes.
            tensor = tensor.reshape(()) if key == "step" else tensor[: part.held]
            tensors[f"state.{group}.{key}"] = tensor.contiguous()
    return tensors


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state()
    return tensors


def save(engine: Engine, root: Path, step: int, state: dict, keep: int) -> Path:
    """Write checkpoint `step` on every rank (a collective); returns its folder."""
    rank = dist.get_rank()
    final = checkpoint_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    pp, tp, dp = _coordinates(engine)
    partitions = zero_partitions(engine.engine.optimizer)
    written = []
    if dp == 0:
        local = {
            prefix + name: tensor.detach().cpu().contiguous()
            for prefix, layer in engine.layers
            for name, tensor in layer.state_dict().items()
        }
        written += [MODEL_FILE.format(p=pp, t=tp), LAYOUT_FILE.format(p=pp, t=tp)]
        save_tensors(local, tmp / written[-2])
        write_json_atomic(tmp / written[-1], describe_stage(engine.layers, partitions))
    written += [OPTIMIZER_FILE.format(p=pp, t=tp, d=dp), f"rng-rank{rank}.safetensors"]
    save_tensors(_optimizer_tensors(partitions), tmp / written[-2])
    save_tensors(_rng_tensors(), tmp / written[-1])
    # Each rank checksums its own files (read back from the page cache), in parallel.
    write_json_atomic(
        tmp / _RANK_FILES.format(rank=rank), {name: file_entry(tmp / name) for name in written}
    )
    dist.barrier()
    if rank == 0:
        layout = {
            "tp": engine.engine.grid.get_slice_parallel_world_size(),
            "pp": engine.engine.grid.get_pipe_parallel_world_size(),
            "dp": engine.dp_world,
            "world": dist.get_world_size(),
        }
        files = {}
        for r in range(dist.get_world_size()):
            listed = tmp / _RANK_FILES.format(rank=r)
            files.update(json.loads(listed.read_text(encoding="utf-8")))
            listed.unlink()
        commit_step(f"checkpoint {step}: write {STATE_FILE}")
        write_json_atomic(
            tmp / STATE_FILE,
            {
                "step": step,
                "layout": layout,
                FILES_KEY: files,
                "scheduler": engine.engine.lr_scheduler.state_dict(),
                **state,
            },
        )
        shutil.rmtree(final, ignore_errors=True)
        commit_step(f"checkpoint {step}: move it into place")
        tmp.rename(final)
        for old in checkpoints(root)[keep:]:
            commit_step(f"checkpoint {step}: remove {old.name}")
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(
    engine: Engine, folder: Path, new_schedule: bool = False, remedy: str = RESTART_REMEDY
) -> dict:
    """Restore the model, optimizer, schedule and RNG states of checkpoint `folder` (chosen by
    `choose`), whatever layout wrote it; returns its state.json. `new_schedule` (a run continued
    from another's final state): the engine's own schedule, with its own peak rate, goes on from the
    checkpoint's step. A checkpoint that cannot be read in this layout raises StageError, ending with
    `remedy`."""
    state = read_state(folder)
    layout = state["layout"]
    grid = engine.engine.grid
    p, t, _ = _coordinates(engine)
    partitions = zero_partitions(engine.engine.optimizer)
    same_cut = (layout["tp"], layout["pp"]) == (
        grid.get_slice_parallel_world_size(),
        grid.get_pipe_parallel_world_size(),
    )
    own = describe_stage(engine.layers, partitions) if same_cut else None
    saved = SavedShards(folder, layout, (p, t), own, remedy)
    _load_weights(engine, saved)
    _load_optimizer(engine, partitions, saved)
    scheduler = engine.engine.lr_scheduler
    if new_schedule:
        scheduler.last_epoch = state["step"]
    else:
        scheduler.load_state_dict(state["scheduler"])
    # The saved state holds the step and the rate of the schedule it was written under; the rate is
    # taken again from this run's schedule (another train.steps changes it), and the optimizer's
    # groups would only get it at the next step.
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
    ):
        group["lr"] = base * factor(scheduler.last_epoch)
    engine.engine.global_steps = state["step"]
    # Each rank's generators where each rank has the same place in the same layout.
    if same_cut and layout["world"] == dist.get_world_size():
        rng = load_file(str(folder / f"rng-rank{dist.get_rank()}.safetensors"))
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return state


def _load_weights(engine: Engine, saved: SavedShards) -> None:
    with torch.no_grad():
        for prefix, layer in engine.layers:
            shards = parameter_shards(layer)
            for name, tensor in layer.state_dict().items():
                tensor.copy_(saved.weight(prefix + name, shards.get(name), tensor))


def _load_optimizer(engine: Engine, partitions: list[ZeroPartition], saved: SavedShards) -> None:
    """Each of this rank's ZeRO partitions filled, a parameter at a time, with the part of that
    parameter's saved master copy and states that falls into it (the idle anchor's stays zero)."""
    names = parameter_names(engine.layers)
    anchor = getattr(engine.engine.module, "idle_anchor", None)
    for part in partitions:
        values = {MASTER: part.master}
        for key in saved.state_keys:
            values[key] = part.state.setdefault(key, torch.zeros_like(part.master))
        if saved.step is not None:
            part.state["step"] = torch.tensor(
                saved.step, dtype=torch.float32, device=part.master.device
            )
        with torch.no_grad():
            for tensor in values.values():
                tensor.zero_()
            offset, end = 0, part.start + part.held
            for param, padding in zip(part.params, part.paddings):
                first, last = max(offset, part.start), min(offset + param.numel(), end)
                if first < last and param is not anchor:
                    shard = getattr(param, "tp_shard", None)
                    for key, tensor in values.items():
                        value = saved.optimizer_value(names[id(param)], key, shard, param)
                        tensor[first - part.start : last - part.start].copy_(
                            value.flatten()[first - offset : last - offset]
                        )
                offset += param.numel() + padding
    relink_zero_partitions(engine.engine.optimizer, saved.step)
