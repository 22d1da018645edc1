"""Training checkpoints: everything to continue a run exactly, written so that a kill never leaves
one that looks complete, and readable with another data-parallel degree.

A checkpoint is a folder `checkpoints/step-00001000/`:
- `model-pp{p}-tp{t}.safetensors`: each pipeline stage's (and tensor-parallel shard's) own weights,
  written by its first data-parallel replica;
- `optim-pp{p}-tp{t}-dp{d}.safetensors` + `.json`: DeepSpeed ZeRO-1's partition of the fp32 master
  weights and of Adam's moments for that rank, without DeepSpeed's alignment padding (its elastic
  layout), so that ZeRO can cut them again for another data-parallel degree;
- `rng-rank{r}.safetensors`: the random-number generator states;
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
from deepspeed.checkpoint.constants import (
    BASE_OPTIMIZER_STATE,
    BASE_OPTIMIZER_STATE_STEP,
    CLIP_GRAD,
    DS_VERSION,
    GROUP_PADDINGS,
    PARAM_ALIGNMENT_PADDINGS,
    PARTITION_COUNT,
    SINGLE_PARTITION_OF_FP32_GROUPS,
)
from safetensors.torch import load_file

from pipeline.commit_steps import commit_step
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
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


def _optimizer_files(optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, keys = {}, []
    for group, group_state in enumerate(state[BASE_OPTIMIZER_STATE]):
        keys.append(sorted(group_state))
        for key, value in group_state.items():
            tensor = torch.as_tensor(value).detach().cpu()
            if key == "step":
                # A scalar, as Adam keeps it (ZeRO restores it as a tensor of one element): a resumed
                # run writes the bytes an uninterrupted one writes, and `_recut` does not cut it.
                tensor = tensor.reshape(())
            tensors[f"state.{group}.{key}"] = tensor.contiguous()
    for group, partition in enumerate(state[SINGLE_PARTITION_OF_FP32_GROUPS]):
        tensors[f"fp32.{group}"] = partition.detach().cpu().contiguous()
    about = {
        "keys": keys,
        GROUP_PADDINGS: state[GROUP_PADDINGS],
        PARTITION_COUNT: state[PARTITION_COUNT],
        PARAM_ALIGNMENT_PADDINGS: state.get(PARAM_ALIGNMENT_PADDINGS),
        CLIP_GRAD: state[CLIP_GRAD],
        DS_VERSION: state[DS_VERSION],
    }
    return tensors, about


def _optimizer_state(tensors: dict[str, torch.Tensor], about: dict, device) -> dict:
    groups = [
        {key: tensors[f"state.{group}.{key}"].to(device) for key in keys}
        for group, keys in enumerate(about["keys"])
    ]
    step = groups[0]["step"].item() if "step" in groups[0] else None
    state = {
        BASE_OPTIMIZER_STATE: groups,
        BASE_OPTIMIZER_STATE_STEP: step,
        SINGLE_PARTITION_OF_FP32_GROUPS: [
            tensors[f"fp32.{g}"].to(device) for g in range(len(groups))
        ],
        GROUP_PADDINGS: about[GROUP_PADDINGS],
        PARTITION_COUNT: about[PARTITION_COUNT],
        CLIP_GRAD: about[CLIP_GRAD],
        DS_VERSION: about[DS_VERSION],
        "dynamic_loss_scale": False,
        "overflow": False,
    }
    if about.get(PARAM_ALIGNMENT_PADDINGS) is not None:
        state[PARAM_ALIGNMENT_PADDINGS] = about[PARAM_ALIGNMENT_PADDINGS]
    return state


def _recut(saved: list[tuple[dict, dict]], world: int) -> list[tuple[dict, dict]]:
    """The saved ranks' partitions cut into `world` pieces. ZeRO joins whatever pieces it gets (its
    elastic layout has no padding) and cuts its own partition from the whole, but it also reads the
    entry of its own data-parallel rank: so there must be one per current rank."""
    if len(saved) == world:
        return saved
    about = saved[0][1]
    joined = {}
    for key, first in saved[0][0].items():
        joined[key] = (
            torch.cat([tensors[key] for tensors, _ in saved]) if first.dim() > 0 else first
        )
    pieces = [{} for _ in range(world)]
    for key, tensor in joined.items():
        parts = torch.tensor_split(tensor, world) if tensor.dim() > 0 else [tensor] * world
        for piece, part in zip(pieces, parts):
            piece[key] = part.contiguous()
    return [(piece, about) for piece in pieces]


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
    written = []
    if dp == 0:
        local = {
            prefix + name: tensor.detach().cpu().contiguous()
            for prefix, layer in engine.layers
            for name, tensor in layer.state_dict().items()
        }
        written.append(f"model-pp{pp}-tp{tp}.safetensors")
        save_tensors(local, tmp / written[-1])
    tensors, about = _optimizer_files(engine.engine.optimizer)
    written += [
        f"optim-pp{pp}-tp{tp}-dp{dp}.safetensors",
        f"optim-pp{pp}-tp{tp}-dp{dp}.json",
        f"rng-rank{rank}.safetensors",
    ]
    save_tensors(tensors, tmp / written[-3])
    (tmp / written[-2]).write_text(json.dumps(about), encoding="utf-8")
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


def load(engine: Engine, folder: Path, new_schedule: bool = False) -> dict:
    """Restore the model, optimizer, schedule and RNG states of checkpoint `folder` (chosen by
    `choose`); returns its state.json. `new_schedule` (a run continued from another's final state):
    the engine's own schedule, with its own peak rate, goes on from the checkpoint's step."""
    state = read_state(folder)
    layout = state["layout"]
    grid = engine.engine.grid
    tp, pp = grid.get_slice_parallel_world_size(), grid.get_pipe_parallel_world_size()
    if (layout["tp"], layout["pp"]) != (tp, pp):
        raise StageError(
            f"The checkpoint {folder} was written with parallel.tp={layout['tp']} and "
            f"parallel.pp={layout['pp']}; this run has tp={tp}, pp={pp}. Resume with the same "
            f"tensor and pipeline layout (the data-parallel degree may change), or start again "
            f"with resume=never."
        )
    p, t, _ = _coordinates(engine)
    weights = load_file(str(folder / f"model-pp{p}-tp{t}.safetensors"))
    with torch.no_grad():
        for prefix, layer in engine.layers:
            for name, tensor in layer.state_dict().items():
                tensor.copy_(weights[prefix + name])
    device = engine.engine.device
    saved = []
    for d in range(layout["dp"]):
        stem = folder / f"optim-pp{p}-tp{t}-dp{d}"
        about = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
        saved.append((load_file(str(stem.with_suffix(".safetensors"))), about))
    partitions = [
        _optimizer_state(tensors, about, device)
        for tensors, about in _recut(saved, engine.dp_world)
    ]
    engine.engine.optimizer.load_state_dict(
        partitions, load_optimizer_states=True, load_from_fp32_weights=True
    )
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
    if layout["world"] == dist.get_world_size():
        rng = load_file(str(folder / f"rng-rank{dist.get_rank()}.safetensors"))
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return state
