"""Downstream tasks scored during training (`train.eval_tasks`): the multiple-choice metrics of
stage=evaluate (pipeline/evaluation/task_scoring.py), on the same pairs tokenized the same way, but
with the log-likelihoods from the training engine.

The launching process turns each task's questions into (context, continuation) pairs
(task_scoring.choice_pairs: each choice after its prompt, and each distinct choice after an empty
prompt for acc_mutual_info), each into the tokens the model reads (task_scoring.scored_sequences),
and packs them into rows of the training length as held-out text is packed: several pairs a row,
each its own segment, so that it attends to itself only and gets the logits it gets alone. One
unscored position follows each pair, so that each pair's scored labels (its continuation) are a run
of their own: the pipeline's loss sums each run apart while the scorer asks it to
(pipeline_model.TokenLoss.scoring_runs). The rows, and in numbers only what the metrics need besides
the log-likelihoods (task_scoring.ChoiceLayout), go to task_rows.npz (no pickle).

The ranks score the rows as they score held-out text: each data-parallel replica its share, through
the engine's eval_batch. The last pipeline stage's sums reach the other stages and replicas by two
all-reduces of one tensor of every pair (the others add zeros), the same shape on every rank.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import IGNORE
from pipeline.evaluation.eval_config import TaskConfig, task_name
from pipeline.evaluation.task_files import Task, read_task
from pipeline.evaluation.task_scoring import (
    ChoiceLayout,
    Encode,
    accuracies,
    choice_pairs,
    scored_sequences,
    task_questions,
)
from pipeline.training.heldout import row_batches


@dataclass
class TaskRows:
    """The tasks' scored sequences (each task's pairs, then its pairs with an empty prompt) packed
    into rows."""

    inputs: np.ndarray  # (rows, seq_len) int64
    labels: np.ndarray  # (rows, seq_len) int64: a continuation's tokens, IGNORE elsewhere
    segment_ids: np.ndarray  # (rows, seq_len) int64
    # (rows + 1,): row r holds the sequences row_sequences[r] : row_sequences[r + 1], in order.
    row_sequences: np.ndarray
    # (tasks + 1,): task t's sequences are task_sequences[t] : task_sequences[t + 1].
    task_sequences: np.ndarray
    layouts: list[ChoiceLayout]  # each task's

    def __len__(self) -> int:
        return len(self.inputs)

    def padded_to(self, multiple: int) -> TaskRows:
        """With rows that score nothing added, to a multiple of `multiple` rows."""
        extra = -len(self) % multiple
        shape = (extra, self.inputs.shape[1])
        return TaskRows(
            np.concatenate([self.inputs, np.zeros(shape, dtype=np.int64)]),
            np.concatenate([self.labels, np.full(shape, IGNORE, dtype=np.int64)]),
            np.concatenate([self.segment_ids, np.zeros(shape, dtype=np.int64)]),
            np.concatenate([self.row_sequences, np.repeat(self.row_sequences[-1:], extra)]),
            self.task_sequences,
            self.layouts,
        )


def read_loop_tasks(configured: list[TaskConfig], names: list[str], scratch: Path) -> list[Task]:
    """The entries of `configured` (eval.tasks) that `names` (train.eval_tasks) names, in its order,
    read and checked (task_files.read_task)."""
    by_name = {task_name(task): task for task in configured}
    return [read_task(by_name[name], scratch) for name in names]


def pack_sequences(
    sequences: Sequence[tuple[list[int], int]], seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, labels, segment ids, row_sequences) of the scored sequences (scored_sequences: at
    most seq_len + 1 tokens, the last `count` of them scored) packed in order, one unscored position
    between two in a row."""
    rows, ends = [], []
    inputs: list[int] = []
    labels: list[int] = []
    segments: list[int] = []

    def close_row(done: int) -> None:
        padding = seq_len - len(inputs)
        rows.append(
            (
                inputs + [0] * padding,
                labels + [IGNORE] * padding,
                segments + [segments[-1] + 1] * padding,
            )
        )
        ends.append(done)
        for part in (inputs, labels, segments):
            part.clear()

    for index, (whole, count) in enumerate(sequences):
        size = len(whole) - 1
        if inputs and len(inputs) + 1 + size > seq_len:
            close_row(index)
        if inputs:
            inputs.append(0)
            labels.append(IGNORE)
            segments.append(segments[-1] + 1)
        segment = segments[-1] + 1 if segments else 0
        inputs.extend(whole[:-1])
        labels.extend([IGNORE] * (size - count) + whole[size - count + 1 :])
        segments.extend([segment] * size)
    if inputs:
        close_row(len(sequences))
    arrays = (np.asarray([row[part] for row in rows], dtype=np.int64) for part in range(3))
    return (
        *(array.reshape(-1, seq_len) for array in arrays),
        np.asarray([0, *ends], dtype=np.int64),
    )


def task_rows(tasks: Sequence[Task], encode: Encode, start_id: int, seq_len: int) -> TaskRows:
    """The rows of `tasks` (multiple choice: their questions; classification: k-shot prompting),
    each pair read as `[start_id, *context, *continuation]` in at most `seq_len` inputs."""
    sequences: list[tuple[list[int], int]] = []
    layouts, task_sequences = [], [0]
    for task in tasks:
        pairs, alone, layout = choice_pairs(task_questions(task))
        scored = scored_sequences(encode, start_id, seq_len, [*pairs, *alone])
        for (context, continuation), (_, count) in zip([*pairs, *alone], scored):
            if count < 1:
                raise StageError(
                    f"train.eval_tasks: in the task {task.name}, the choice {continuation!r} after "
                    f"{context[-40:]!r} is no token in the pack's tokenizer, so it cannot be "
                    "scored; fix the task's file or leave the task out of train.eval_tasks."
                )
        sequences.extend(scored)
        layouts.append(layout)
        task_sequences.append(len(sequences))
    inputs, labels, segment_ids, row_sequences = pack_sequences(sequences, seq_len)
    return TaskRows(
        inputs,
        labels,
        segment_ids,
        row_sequences,
        np.asarray(task_sequences, dtype=np.int64),
        layouts,
    )


def save_task_rows(rows: TaskRows, path: Path) -> None:
    """The rows and each task's layout as flat integer arrays (np.load needs no pickle)."""
    layouts = rows.layouts
    np.savez(
        path,
        inputs=rows.inputs,
        labels=rows.labels,
        segment_ids=rows.segment_ids,
        row_sequences=rows.row_sequences,
        task_sequences=rows.task_sequences,
        # Per task its questions' offset, per question its choices and the right one, per choice
        # its characters, bytes and pair with an empty prompt (-1 without).
        task_questions=np.asarray(
            list(itertools.accumulate((len(layout.correct) for layout in layouts), initial=0))
        ),
        choices=np.asarray([n for layout in layouts for n in np.diff(layout.offsets)], np.int64),
        correct=np.asarray([i for layout in layouts for i in layout.correct], np.int64),
        chars=np.asarray([n for layout in layouts for n in layout.chars], np.int64),
        utf8_bytes=np.asarray([n for layout in layouts for n in layout.utf8_bytes], np.int64),
        prior=np.asarray(
            [i for layout in layouts for i in layout.prior or [-1] * len(layout.chars)], np.int64
        ),
    )


def load_task_rows(path: Path) -> TaskRows:
    stored = np.load(path, allow_pickle=False)
    task_questions = stored["task_questions"]
    question_pairs = np.concatenate([[0], np.cumsum(stored["choices"])])
    layouts = []
    for task in range(len(task_questions) - 1):
        questions = slice(int(task_questions[task]), int(task_questions[task + 1]))
        pairs = slice(int(question_pairs[questions.start]), int(question_pairs[questions.stop]))
        prior = tuple(int(i) for i in stored["prior"][pairs])
        layouts.append(
            ChoiceLayout(
                tuple(
                    int(n)
                    for n in question_pairs[questions.start : questions.stop + 1] - pairs.start
                ),
                tuple(int(i) for i in stored["correct"][questions]),
                tuple(int(n) for n in stored["chars"][pairs]),
                tuple(int(n) for n in stored["utf8_bytes"][pairs]),
                None if -1 in prior else prior,
            )
        )
    return TaskRows(
        stored["inputs"],
        stored["labels"],
        stored["segment_ids"],
        stored["row_sequences"],
        stored["task_sequences"],
        layouts,
    )


def sequence_log_likelihoods(engine, rows: TaskRows, micro: int) -> np.ndarray:
    """log p(continuation | context) in nats of every scored sequence of `rows` (their number a
    multiple of micro x the data-parallel replicas), on every rank; each replica scores its share."""
    ds, dp_rank, dp_world = engine.engine, engine.dp_rank, engine.dp_world
    share = len(rows) // dp_world
    part = slice(dp_rank * share, (dp_rank + 1) * share)
    first, stop = int(rows.row_sequences[part.start]), int(rows.row_sequences[part.stop])
    # float64 and on the engine's device: NCCL reduces no host tensor (gloo, on a CPU, does).
    total = torch.zeros(int(rows.row_sequences[-1]), dtype=torch.float64, device=ds.device)
    with ds.module.loss_fn.scoring_runs() as runs:
        ds.eval_batch(
            iter(row_batches(rows, part, micro, ds.device)),
            num_micro_batches=share // micro,
            reduce_output=None,
            bcast_loss=False,
        )
    if ds.is_last_stage():
        sums = torch.cat(runs)
        if len(sums) != stop - first:
            raise StageError(
                f"in-loop tasks: the loss found {len(sums)} scored runs in rows {part.start} to "
                f"{part.stop - 1}, which hold {stop - first} pairs. This is a bug; please report it."
            )
        total[first:stop] = -sums.double()
    # The other pipeline stages and replicas add zeros: the last stage's sums, everywhere.
    if ds.num_stages > 1:
        dist.all_reduce(total, group=ds.grid.get_pipe_parallel_group())
    if dp_world > 1:
        dist.all_reduce(total, group=ds.grid.get_data_parallel_group())
    return total.cpu().numpy()


@dataclass
class InloopTasks:
    """The tasks a training run scores (`names`, train.eval_tasks' order) and their rows."""

    names: list[str]
    rows: TaskRows
    # The latest scoring's log-likelihood of every scored sequence (TaskRows' order).
    last: Optional[np.ndarray] = None

    def score(self, engine, micro: int) -> dict[str, dict[str, float]]:
        """Each task's accuracy by metric (acc, acc_norm, acc_bytes, acc_mutual_info) now."""
        self.last = sequence_log_likelihoods(engine, self.rows, micro)
        scores = {}
        for task, (name, layout) in enumerate(zip(self.names, self.rows.layouts)):
            scored = self.last[self.rows.task_sequences[task] : self.rows.task_sequences[task + 1]]
            pairs = layout.offsets[-1]
            found = accuracies(layout, scored[:pairs].tolist(), scored[pairs:].tolist())
            scores[name] = {metric: accuracy.accuracy for metric, accuracy in found.items()}
        return scores


def load_inloop_tasks(
    path: Path, names: list[str], seq_len: int, micro: int, dp_world: int
) -> InloopTasks:
    """The rows the launching process wrote for this job, checked against its shape: the engine's
    micro-batches of `micro` x `seq_len` tokens on `dp_world` replicas."""
    rows = load_task_rows(path)
    if (
        rows.inputs.shape[1] != seq_len
        or len(rows) % (micro * dp_world)
        or len(rows.layouts) != len(names)
    ):
        raise StageError(
            f"{path} holds {len(rows.layouts)} tasks in {len(rows)} rows of {rows.inputs.shape[1]} "
            f"tokens, not {len(names)} tasks in whole micro-batches of {micro} x {seq_len} tokens on "
            f"{dp_world} data-parallel replicas: it was written for another job. Run the stage "
            "again, which writes it anew."
        )
    return InloopTasks(list(names), rows)
