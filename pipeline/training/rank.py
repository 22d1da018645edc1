"""One rank of a training stage: engine, sampler, resume, loop, and its share of the trained model.

Reads everything from the job (pipeline/training/job.py) and the files the launching process wrote
into the job's folder: the starting model in `init/`, the held-out rows in `heldout.npz` and, with
train.eval_tasks, the tasks' rows in `task_rows.npz`.

Each rank is `python -m pipeline.training.rank <job.yaml>` (`main`), started by
pipeline/training/run.py through pipeline/parallel/ranks.py; with one rank outside Slurm, run.py
calls `train_rank` in its own process.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch.distributed as dist

from pipeline.errors import StageError, StageInterrupted
from pipeline.json_files import write_json_atomic
from pipeline.kernels import set_backend
from pipeline.model.base_shape import CHECKPOINT_CONFIG, read_model_config
from pipeline.model.model_config import flops_per_token
from pipeline.model.model_tensors import CHECKPOINT_WEIGHTS
from pipeline.packing.sampler import PackedSampler
from pipeline.parallel.ranks import slurm_ranks
from pipeline.training import checkpoint
from pipeline.training.checkpoint_files import checkpoint_dir
from pipeline.training.engine import build_engine, init_distributed
from pipeline.training.heldout import load_rows
from pipeline.training.inloop_tasks import InloopTasks, load_inloop_tasks
from pipeline.training.job import (
    CHECKPOINTS,
    HELDOUT_FILE,
    INIT,
    METRICS_FILE,
    RESULT_FILE,
    TASK_ROWS_FILE,
    TASK_SCORES_FILE,
    TRAINED,
    TrainingJob,
    read_job,
)
from pipeline.training.loop import Checkpointing, RunState, train_loop
from pipeline.training.peak_memory import peaks_of_all_ranks, return_large_blocks_to_the_system
from pipeline.training.weights import join_parts, save_part

log = logging.getLogger(__name__)


def train_rank(job: TrainingJob) -> None:
    """Train the model of `init/`; `job.resume` (auto|never) enables checkpoints."""
    set_backend(job.kernels)
    return_large_blocks_to_the_system()
    init_distributed(job.parallel.collective_timeout_s)
    rank = dist.get_rank()
    folder = Path(job.folder)
    model_cfg = read_model_config(folder / INIT / CHECKPOINT_CONFIG)
    engine = build_engine(
        model_cfg,
        job.train,
        job.parallel,
        folder / INIT / CHECKPOINT_WEIGHTS,
        job.trains,
        job.leading_rows,
        job.leading_rows_step,
        job.schedule_start,
    )
    heldout = load_rows(folder / HELDOUT_FILE)
    tasks = _inloop_tasks(job, engine)
    sampler = PackedSampler(
        Path(job.pack),
        seq_len=job.seq_len,
        global_batch_size=job.train.global_batch_size,
        seed=job.train.seed,
        rank=engine.dp_rank,
        world=engine.dp_world,
    )
    if rank == 0 and job.leading_rows:
        _say_leading_rows(job, sampler)
    state, checkpointing = RunState(), None
    if job.resume is not None:
        root = folder / CHECKPOINTS
        state = _resumed_state(job, engine, sampler, root)

        def save(step: int) -> Path:
            return checkpoint.save(
                engine,
                root,
                step,
                {"run": state.as_dict(), "sampler": sampler.state_dict()},
                job.train.keep_checkpoints,
            )

        checkpointing = Checkpointing(job.train.checkpoint_every, save)
    result = train_loop(
        engine,
        sampler,
        job.train,
        heldout,
        folder / METRICS_FILE,
        is_logger=rank == 0,
        flops_per_token=flops_per_token(model_cfg, job.seq_len),
        run=state,
        checkpointing=checkpointing,
        tasks=tasks,
    )
    if tasks is not None and rank == 0:
        np.save(folder / TASK_SCORES_FILE, tasks.last)
    # What a later run continues from (pipeline/training/run.py keeps it as final_state/).
    if (
        checkpointing
        and job.train.keep_final_state
        and not checkpoint_dir(root, state.step).is_dir()
    ):
        checkpointing.save(state.step)
    _save_trained(engine, folder)
    # After the save, so that the peaks include it; the launching process adds its own (the export).
    peaks = peaks_of_all_ranks(engine.engine.grid)
    if rank == 0:
        write_json_atomic(folder / RESULT_FILE, {**result, "peak_memory_per_rank": peaks})
    dist.barrier()
    dist.destroy_process_group()


def _inloop_tasks(job: TrainingJob, engine) -> Optional[InloopTasks]:
    """The rows of train.eval_tasks, checked against the engine's micro-batches and the job's
    sequence length; None without tasks."""
    if not job.train.eval_tasks:
        return None
    return load_inloop_tasks(
        Path(job.folder) / TASK_ROWS_FILE,
        job.train.eval_tasks,
        job.seq_len,
        engine.engine.train_micro_batch_size_per_gpu(),
        engine.dp_world,
    )


def _say_leading_rows(job: TrainingJob, sampler: PackedSampler) -> None:
    log.info(
        "%s: the vocabulary rows below %d %s",
        job.stage,
        job.leading_rows,
        f"learn from the sequences of {', '.join(sampler.names)}, by steps "
        f"{job.leading_rows_step:g} times "
        f"the learning rate's"
        if job.leading_rows_step
        else "stay as they are",
    )


def _resumed_state(job: TrainingJob, engine, sampler: PackedSampler, root: Path) -> RunState:
    """The run's state from its newest checkpoint that verifies, with the engine and the sampler
    restored to it; else, for a continued run, from the final state of the run it continues: its
    model, optimizer and data position, on this run's own schedule, counting steps and tokens on
    from there. A fresh state when there is neither."""
    device, is_logger = engine.engine.device, dist.get_rank() == 0
    found = checkpoint.choose(root, device)
    continued = found is None and job.continue_from is not None
    remedy = checkpoint.RESTART_REMEDY
    if continued:
        remedy = "Train the run it continues again, or start this one another way (init=)."
        found = checkpoint.choose(Path(job.continue_from), device, remedy=remedy)
    if found is None and continued:
        raise StageError(
            f"{job.stage}: {job.continue_from}, the final training state of the run it continues, "
            "holds no checkpoint. Train that run again, or start this one another way (init=)."
        )
    if found is None:
        return RunState()
    saved = checkpoint.load(engine, found, new_schedule=continued, remedy=remedy)
    sampler.load_state_dict(saved["sampler"])
    if not continued:
        state = RunState(**saved["run"])
        if is_logger:
            log.info("Resuming from %s (step %d of %d)", found, state.step, job.train.steps)
        return state
    if is_logger:
        log.info(
            "Continuing from %s: step %d, the data at sequence %d; training to step %d",
            found,
            saved["step"],
            saved["sampler"]["sequences"],
            job.train.steps,
        )
    return RunState(step=saved["run"]["step"], tokens=saved["run"]["tokens"])


def _save_trained(engine, folder: Path) -> None:
    """The trained model as one pipeline checkpoint in `checkpoint/`: each stage's part, joined by
    rank 0."""
    parts = folder / "parts"
    if dist.get_rank() == 0:
        parts.mkdir(exist_ok=True)
    dist.barrier()
    if engine.dp_rank == 0:
        save_part(
            engine.layers,
            parts / f"stage{engine.engine.grid.get_pipe_parallel_rank():03d}.safetensors",
        )
    dist.barrier()
    if dist.get_rank() == 0:
        trained = folder / TRAINED
        trained.mkdir(exist_ok=True)
        join_parts(sorted(parts.glob("stage*.safetensors")), trained / CHECKPOINT_WEIGHTS)
        shutil.copyfile(folder / INIT / CHECKPOINT_CONFIG, trained / CHECKPOINT_CONFIG)
        shutil.rmtree(parts)


def main() -> None:
    slurm_ranks()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job", type=Path, help="the job file the launching process wrote")
    args = parser.parse_args()
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(
        level=logging.INFO, format=f"[%(asctime)s][rank {rank}][%(name)s] %(message)s"
    )
    try:
        train_rank(read_job(args.job))
    except StageInterrupted as stop:
        log.warning("%s", stop)
        sys.exit(StageInterrupted.exit_code)
    except Exception:
        log.exception("This rank failed")
        sys.exit(1)
    # Every output is written (train_rank's last barrier saw to it). Leave without the interpreter's
    # teardown: with gloo, objects of DeepSpeed's process groups destroyed there can abort the
    # process (SIGABRT, "terminate called without an active exception"), which srun reports as a
    # failed rank and answers by killing the others.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
