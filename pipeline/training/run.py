"""The one entry of a training stage's launching process: given the ranks' job and what it reads
(`StageTraining`, which pipeline/stages/training_inputs.py fills from the stages before),
`train_stage` writes the starting model and the held-out rows (and the rows of train.eval_tasks), runs
the ranks, exports the trained
model as a transformers folder and writes the stage's report. `warmup` and `pretrain` only say what
differs: the starting model, the `train` section and which parameters train. The rank side is
pipeline/training/rank.py; the files they share are named in pipeline/training/job.py.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Iterable, Optional

import torch
from tokenizers import Tokenizer

from pipeline.cluster import ClusterConfig
from pipeline.commit_steps import commit_step
from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import scoring_rows
from pipeline.evaluation.eval_config import TaskConfig
from pipeline.evaluation.task_files import Task
from pipeline.evaluation.task_scoring import encode_texts
from pipeline.json_files import read_json, write_json_atomic
from pipeline.model.model_config import ExportConfig, shard_bytes
from pipeline.model.files import refuse_non_finite
from pipeline.model.hf_export import TOKENIZER_FILES, NonFiniteWeights, to_hf
from pipeline.model.model_tensors import (
    CheckpointTensors,
    StartingModel,
    model_shapes,
    write_checkpoint,
)
from pipeline.packing.packed import PACKED_FILE
from pipeline.parallel.ranks import distributed_environment, free_port, run_ranks
from pipeline.tokenization.folder import token_roles, tokenizer_digest
from pipeline.training.checkpoint_files import (
    checkpoint_dir,
    checkpoint_step,
    checkpoints,
    describe,
)
from pipeline.training.train_config import use_bf16
from pipeline.training.heldout import save_rows
from pipeline.training.inloop_tasks import read_loop_tasks, save_task_rows, task_rows
from pipeline.training.job import (
    CHECKPOINTS,
    EXPORT,
    FINAL_STATE,
    HELDOUT_FILE,
    INIT,
    METRICS_FILE,
    RESULT_FILE,
    TASK_ROWS_FILE,
    TASK_SCORES_FILE,
    TRAINED,
    VOCABULARY_MATRICES,
    TrainingJob,
    write_job,
)
from pipeline.training.peak_memory import peak_memory
from pipeline.work_folder import MARKER

log = logging.getLogger(__name__)


def write_heldout(job: TrainingJob, texts: Iterable[str], tokenizer, start_id: int) -> dict:
    """The held-out rows every rank scores: documents in windows of the training length moving on by
    half of it, up to `train.eval_tokens` scored tokens, padded to whole batches. Returns their
    size."""
    rows = scoring_rows(
        texts,
        tokenizer,
        start_id,
        job.seq_len,
        stride=max(1, job.seq_len // 2),
        max_tokens=job.train.eval_tokens,
    )
    if rows.documents == 0:
        raise StageError(
            f"{job.stage}: the held-out text is empty, so held-out bits per byte cannot be scored. "
            "Run "
            f"the clean stage again with a larger held-out split (clean.heldout_min_documents, "
            f"clean.heldout_fraction), or give it more text."
        )
    save_rows(
        rows.padded_to(job.train.micro_batch_size * job.parallel.dp),
        Path(job.folder) / HELDOUT_FILE,
    )
    return {"documents": rows.documents, "tokens": rows.tokens, "bytes": rows.bytes}


def write_task_rows(
    job: TrainingJob, tasks: list[Task], tokenizer, start_id: Optional[int]
) -> dict:
    """The rows of the tasks the ranks score in the loop (train.eval_tasks), each sequence starting
    with `start_id` as stage=evaluate reads it (eval.document_start), padded to whole batches.
    Returns their size per task."""
    path = Path(job.folder) / TASK_ROWS_FILE
    if not tasks:  # nor those of an earlier run with tasks
        path.unlink(missing_ok=True)
        (Path(job.folder) / TASK_SCORES_FILE).unlink(missing_ok=True)
        return {}
    if start_id is None:
        raise StageError(
            f"{job.stage}: the pack's tokenizer has no token for eval.document_start, so the tasks "
            "of train.eval_tasks cannot be read as stage=evaluate reads them; set "
            "eval.document_start to the token the model saw before documents (eos or bos)."
        )
    rows = task_rows(tasks, partial(encode_texts, tokenizer), start_id, job.seq_len)
    save_task_rows(rows.padded_to(job.train.micro_batch_size * job.parallel.dp), path)
    return {
        task.name: {
            "questions": len(layout.correct),
            "sequences": int(rows.task_sequences[index + 1] - rows.task_sequences[index]),
        }
        for index, (task, layout) in enumerate(zip(tasks, rows.layouts))
    }


def check_pack_tokenizer(
    job: TrainingJob, packed: dict, tokenizer_file: Path, vocab_size: int
) -> None:
    """The token ids in the pack are those of the tokenizer the pack stage used: the one this stage
    loads must be it (same vocabulary size and file hash), checked before any rank starts."""
    recorded = packed["tokenizer"]
    found = {"vocab_size": vocab_size, "sha256": tokenizer_digest(tokenizer_file)}
    differs = [key for key in found if key in recorded and recorded[key] != found[key]]
    if differs:
        raise StageError(
            f"{job.stage}: the tokenizer {tokenizer_file} ({found['vocab_size']:,} tokens, sha256 "
            f"{found['sha256'][:12]}) is not the one the data in {job.pack} was packed with "
            f"({recorded['vocab_size']:,} tokens, sha256 {recorded.get('sha256', '?')[:12]}, "
            "recorded "
            f"in its {PACKED_FILE}): the token ids would not match. The tokenizer was changed "
            "after the "
            f"pack stage ran; run both again (delete {tokenizer_file.parent / MARKER}, then "
            f"stage=tokenizer and stage=pack)."
        )


def launch(job: TrainingJob, cluster) -> dict:
    """Train on tp x pp x dp ranks; returns what rank 0 wrote to train_result.json. One rank outside
    Slurm runs in this process: no start-up cost for the demo, and a debugger sees the training
    loop."""
    folder = Path(job.folder)
    (folder / RESULT_FILE).unlink(missing_ok=True)
    world_size = job.parallel.world_size
    # DeepSpeed takes a while to import and start: say what comes before it does.
    log.info(
        "%s: starting DeepSpeed on %d rank(s) (tp %d x pp %d x dp %d) for %d steps of %d sequences "
        "x %d tokens; "
        "progress below, metrics in %s",
        job.stage,
        world_size,
        job.parallel.tp,
        job.parallel.pp,
        job.parallel.dp,
        job.train.steps,
        job.train.global_batch_size,
        job.seq_len,
        folder / METRICS_FILE,
    )
    if world_size == 1 and cluster.executor != "slurm":
        from pipeline.training.rank import train_rank  # DeepSpeed: only when a training stage runs

        os.environ.update(distributed_environment(0, 1, free_port()))
        train_rank(job)
    else:
        run_ranks(
            ["-m", "pipeline.training.rank", str(write_job(job))],
            world_size,
            cluster,
            folder / "rank_logs",
        )
    return json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))


def _non_finite(result: dict) -> dict:
    """The final loss or held-out score of the ranks' result that is not finite (last_loss is None
    when no step was taken: a budget already met)."""
    return {
        key: result[key]
        for key in ("last_loss", "heldout_bpb_after")
        if result.get(key) is not None and not math.isfinite(result[key])
    }


def refuse_non_finite_end(job: TrainingJob, result: dict) -> None:
    """A run whose final loss or held-out score is not finite is neither exported nor marked done;
    its checkpoints stay."""
    bad = _non_finite(result)
    if bad:
        raise StageError(
            f"{job.stage}: training ended with "
            f"{', '.join(f'{key} {value}' for key, value in bad.items())}"
            f" ({result['skipped_steps']} of {result['steps']} steps skipped); the model is "
            "neither "
            f"exported nor marked done. Its metrics are in {Path(job.folder) / METRICS_FILE}. "
            "Lower the "
            "learning rate, raise its warm-up steps or check the data and the starting model, "
            "then "
            f"run again."
        )


def _finished_result(folder: Path, job: TrainingJob) -> Optional[dict]:
    """What the ranks wrote when they finished this job's steps (the result file is written last,
    after the trained model), or None; a non-finite end is trained again from the checkpoints, as
    before."""
    if not (folder / RESULT_FILE).is_file():
        return None
    result = read_json(folder / RESULT_FILE)
    return result if not _non_finite(result) and result.get("steps") == job.train.steps else None


def export_trained(folder: Path, tokenizer_dir: Path, max_shard_bytes: int) -> None:
    """The trained model of `checkpoint/` with its tokenizer beside it, and as a transformers folder
    `hf/` in shards of at most `max_shard_bytes`, written a tensor at a time (this process never
    holds the model)."""
    trained_dir = folder / TRAINED
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, trained_dir / name)
    shutil.rmtree(folder / EXPORT, ignore_errors=True)
    try:
        to_hf(
            CheckpointTensors(trained_dir),
            folder / EXPORT,
            tokenizer=tokenizer_dir,
            max_shard_bytes=max_shard_bytes,
        )
    except NonFiniteWeights as error:
        shutil.rmtree(folder / EXPORT, ignore_errors=True)
        refuse_non_finite(
            error.names,
            f"The trained model in {trained_dir}",
            "it is neither exported nor marked "
            "done. Lower the learning rate or check the data and the starting model, then run "
            "again.",
        )


# Where the launching process unpacks the clean stage's shards while it reads them: a subfolder for
# the held-out text and one for warmup's transfer text, removed once the held-out rows are written.
SCRATCH = "scratch"


@dataclass
class StageTraining:
    """A training stage's job and what it reads from the stages before it."""

    job: TrainingJob
    packed: dict  # the pack's packed.json
    tokenizer_dir: Path
    tokenizer: Tokenizer
    tokenizer_file: Path
    heldout: Iterable[str]  # the clean stage's held-out documents, read when the rows are written
    # eval.tasks, of which the loop scores those that train.eval_tasks names, and the token (eos,
    # bos) that starts their sequences (eval.document_start).
    eval_tasks: list[TaskConfig] = field(default_factory=list)
    task_start: str = "eos"


def train_stage(
    training: StageTraining,
    start: StartingModel,
    cluster: ClusterConfig,
    export: ExportConfig,
    about: dict,
) -> dict:
    """Train `start` as the job says and export the result; writes `report.json` (`about`, then what
    training measured) and returns it.

    The launching process writes the starting model to `init/` a tensor at a time, and the held-out
    rows (and those of the tasks of train.eval_tasks); the ranks train (pipeline/training/rank.py); the trained model in `checkpoint/` becomes a
    transformers folder `hf/`. A job that trains only some parameters (warmup) must have left every
    other tensor as it was. The resumable checkpoints and the starting model go once the marker is
    written (the stages' scratch, pipeline/contract.py)."""
    job, folder = training.job, Path(training.job.folder)
    # A run killed after its ranks finished (in the export, say) is not trained again.
    finished = _finished_result(folder, job)
    if finished is not None:
        log.info(
            "%s: the ranks of the interrupted run had finished its %d steps; their trained model "
            "in %s is "
            "exported.",
            job.stage,
            job.train.steps,
            folder / TRAINED,
        )
    elif job.resume is None or not checkpoints(folder / CHECKPOINTS):
        # A fresh start: no metrics of an attempt that left no checkpoint.
        (folder / METRICS_FILE).unlink(missing_ok=True)
        shutil.rmtree(folder / "tensorboard", ignore_errors=True)
    # Read and checked before the model is written: a bad file fails naming its line and field.
    tasks = read_loop_tasks(training.eval_tasks, job.train.eval_tasks, folder / SCRATCH / "tasks")
    if finished is None:
        # Written a tensor at a time: this process never holds the model.
        refuse_non_finite(write_checkpoint(start.tensors, folder / INIT), start.what, start.advice)
    check_pack_tokenizer(
        job, training.packed, training.tokenizer_file, training.tokenizer.get_vocab_size()
    )
    roles = token_roles(training.tokenizer_dir, training.tokenizer)
    scored = write_heldout(job, training.heldout, training.tokenizer, roles["eos"])
    tasks_scored = write_task_rows(job, tasks, training.tokenizer, roles[training.task_start])
    shutil.rmtree(folder / SCRATCH, ignore_errors=True)
    result = finished or launch(job, cluster)
    refuse_non_finite_end(job, result)
    keep_final_state(job)
    commit_step(f"{job.stage}: export hf/")
    export_trained(folder, training.tokenizer_dir, shard_bytes(export))
    frozen = {}
    if job.trainable is not None:
        held = torch.bfloat16 if use_bf16(job.train) else torch.float32
        names, values = _check_frozen_unchanged(folder / INIT, folder / TRAINED, job, held)
        frozen = {"trained_tensors": names, "trained_parameters": values}
    report = {
        **about,
        **frozen,
        "heldout_scored": scored,
        **({"tasks_scored": tasks_scored} if tasks_scored else {}),
        **result,
        # this process: the starting model, the export (and the training, with one rank started
        # here)
        "peak_memory_stage_process": peak_memory(),
    }
    for name, accuracy in (result.get("tasks_after") or {}).items():
        log.info(
            "%s: %s after training (train.eval_tasks): %s",
            job.stage,
            name,
            ", ".join(f"{metric} {value:.3f}" for metric, value in accuracy.items()),
        )
    commit_step(f"{job.stage}: write report.json")
    write_json_atomic(folder / "report.json", report)
    return report


def keep_final_state(job: TrainingJob) -> None:
    """Move the checkpoint of the last step, which the ranks wrote (train.keep_final_state), to
    final_state/, which the finished output keeps for a run that continues this one; the other
    checkpoints go with the stage's scratch. Each step may be taken again after a kill."""
    folder = Path(job.folder)
    if job.resume is None or not job.train.keep_final_state or (folder / FINAL_STATE).is_dir():
        return
    staging = folder / f".{FINAL_STATE}.tmp"
    staging.mkdir(exist_ok=True)
    if not checkpoints(staging):
        last = checkpoint_dir(folder / CHECKPOINTS, job.train.steps)
        if not last.is_dir():
            log.warning(
                "%s: no checkpoint of the last step %d in %s, so no final state is kept: a run "
                "cannot continue this one (init=continue:<run>).",
                job.stage,
                job.train.steps,
                last.parent,
            )
            staging.rmdir()
            return
        commit_step(f"{job.stage}: keep the final training state")
        os.replace(last, staging / last.name)
    os.replace(staging, folder / FINAL_STATE)


def final_state(folder: Path) -> Optional[Path]:
    """The final training state that a finished training stage in `folder` kept (a checkpoint
    folder), None if it kept none."""
    kept = checkpoints(folder / FINAL_STATE)
    return kept[0] if kept else None


def steps_behind_checkpoints(partial: Path, steps: Optional[int]) -> list[str]:
    """An interrupted run continues with another `steps` budget only if it lies at or past its
    newest checkpoint (fewer steps would end before where it already is)."""
    newest = max((checkpoint_step(path) for path in checkpoints(partial / CHECKPOINTS)), default=0)
    if steps is not None and steps < newest:
        return [f"its newest checkpoint is at step {newest}, past train.steps={steps}"]
    return []


def kept_checkpoints(partial: Path) -> str:
    """The resumable checkpoints an interrupted run left, for the contract's messages."""
    return describe(partial / CHECKPOINTS)


def _check_frozen_unchanged(
    initial: Path, trained: Path, job: TrainingJob, held: torch.dtype
) -> tuple[list[str], int]:
    """Fail if training moved any frozen tensor of the checkpoint `trained` away from the starting
    one `initial` (for warmup the base's body, with warmup.train_head=false the transferred head,
    with warmup.base_rows=frozen the base's rows of the embedding and head), as the engine held it
    (`held`: bf16 on a GPU, where a frozen float32 tensor is rounded once and never updated);
    compared a tensor at a time. Returns the trained tensors' names and their number of values."""
    moved, trained_names, trained_values = [], [], 0
    with CheckpointTensors(initial) as before, CheckpointTensors(trained) as after:
        for name in model_shapes(after.cfg):
            tensor = after.read(name)
            if job.trains(name):
                trained_names.append(name)
                trained_values += tensor.numel()
                rows = (
                    job.leading_rows
                    if name in VOCABULARY_MATRICES and job.leading_rows_step == 0
                    else 0
                )
                if rows and not torch.equal(
                    tensor[:rows], before.read(name)[:rows].to(held).to(tensor.dtype)
                ):
                    moved.append(f"{name}[:{rows}]")
            elif not torch.equal(tensor, before.read(name).to(held).to(tensor.dtype)):
                moved.append(name)
    if moved:
        raise StageError(
            f"{job.stage}: frozen tensors changed during training: {moved[:5]}. This is a bug; "
            "please "
            f"report it."
        )
    return sorted(trained_names), trained_values
