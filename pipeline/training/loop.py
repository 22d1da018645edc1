"""The training loop: take a batch from the sampler, step the engine, log, score held-out text (and
the downstream tasks of train.eval_tasks), checkpoint.

Shared by `warmup` and `pretrain`. A step whose loss or gradient is not finite is skipped by
DeepSpeed (the model and optimizer stay as they were) and counted in the run's state (`RunState`),
which the checkpoints carry: a run stops, with the last good checkpoint in place, when
`train.max_bad_steps` steps in a row were skipped, or when more than `train.max_skipped_fraction` of
the last `train.skipped_window` steps were (scattered skips that never come in a row still mean a
run that is not learning from a good part of its data). A skipped step still moves the learning-rate
schedule on, as it moves the step counter and the data: the rate stays a function of the step,
whatever was skipped before and across a resume.

Slurm asks a run to stop with SIGUSR1 before the time limit and SIGTERM on preemption or scancel. A
signal only sets a flag (`StopRequest`); the loop asks every rank at the end of each step (one
all-reduce), so that all ranks finish the step, write the same checkpoint and stop together, raising
`StageInterrupted` (exit code 75: run the same command again).

Throughput is logged as model TFLOP/s per device and MFU, against a table of peak bf16 dense TFLOP/s
per device.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from pipeline.errors import StageError, StageInterrupted
from pipeline.evaluation.bits_per_byte import ScoringRows
from pipeline.training.train_config import TrainConfig
from pipeline.training.engine import Engine
from pipeline.training.heldout import heldout_bpb, micro_batches
from pipeline.training.inloop_tasks import InloopTasks
from pipeline.training.peak_memory import peak_memory

log = logging.getLogger(__name__)


@dataclass
class Checkpointing:
    every: int
    # Writes a checkpoint of the given step (a collective) and returns its folder.
    save: Callable[[int], Path]


def train_loop(
    engine: Engine,
    sampler,
    train: TrainConfig,
    heldout: ScoringRows,
    metrics_file: Path,
    is_logger: bool,
    flops_per_token: int,
    run: Optional[RunState] = None,
    checkpointing: Optional[Checkpointing] = None,
    tasks: Optional[InloopTasks] = None,
) -> dict:
    """Train up to step `train.steps` from `run.step`; returns the run's summary. Held-out text (and
    `tasks`, train.eval_tasks) is scored before the first step, every `train.eval_every` steps and
    after the last."""
    ds = engine.engine
    run = run or RunState()
    step_tokens = train.global_batch_size * sampler.seq_len
    metrics = MetricsLog(metrics_file, is_logger)

    def evaluate() -> dict:
        bpb = heldout_bpb(engine, heldout, train.micro_batch_size, engine.dp_rank, engine.dp_world)
        entry = {"step": run.step, "heldout_bpb": bpb}
        if tasks is not None:
            entry["tasks"] = tasks.score(engine, train.micro_batch_size)
        metrics.record(entry)
        return entry

    if run.heldout_bpb_before is None:
        first = evaluate()
        run.heldout_bpb_before, run.tasks_before = first["heldout_bpb"], first.get("tasks")
    stop = StopRequest()
    progress = tqdm(
        total=train.steps, initial=run.step, desc="training", unit="step", disable=not is_logger
    )
    started, started_tokens, last_checkpoint = time.perf_counter(), run.tokens, None
    throughput = Throughput(flops_per_token, ds.world_size)
    batches = iter(sampler)  # this rank's rows, from the sampler's step on
    try:
        while run.step < train.steps:
            # the rate this step uses (the schedule moves on inside train_batch)
            lr = ds.get_lr()[0]
            loss = _train_step(ds, next(batches), train, run, step_tokens, last_checkpoint)
            throughput.tokens += step_tokens
            progress.update(1)
            if run.step % train.log_every == 0 or run.step == train.steps:
                entry = _step_entry(ds, run, loss, lr, throughput)
                metrics.record(entry)
                progress.set_postfix(
                    loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{entry['tokens_per_s']:,.0f}"
                )
            if train.eval_every and run.step % train.eval_every == 0 and run.step != train.steps:
                evaluate()
            if checkpointing and checkpointing.every and run.step % checkpointing.every == 0:
                last_checkpoint = checkpointing.save(run.step)
            if stop.agreed(ds.device):
                _stop_on_request(stop, checkpointing, run, last_checkpoint)
    finally:
        progress.close()
        stop.restore()
        metrics.flush()
    seconds = time.perf_counter() - started
    last = evaluate()
    summary = {
        "steps": run.step,
        "tokens": run.tokens,
        "last_loss": run.last_loss,
        "skipped_steps": run.skipped_steps,
        "heldout_bpb_before": run.heldout_bpb_before,
        "heldout_bpb_after": last["heldout_bpb"],
        "seconds": round(seconds, 2),
        "tokens_per_s": round((run.tokens - started_tokens) / seconds, 1) if seconds else None,
    }
    if tasks is not None:
        summary.update(tasks_before=run.tasks_before, tasks_after=last["tasks"])
    metrics.close()  # with the last held-out score on disk
    return summary


def _step_entry(ds, run: RunState, loss: float, lr: float, throughput: Throughput) -> dict:
    """What metrics.jsonl logs of a step: its loss and learning rate, the gradient norm, the tokens
    so far, the speed since the last logged step and the peak memory."""
    speed = throughput.measure()
    grad_norm = ds.get_global_grad_norm()
    return {
        "step": run.step,
        "loss": loss,
        "lr": lr,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "tokens": run.tokens,
        **speed,
        **peak_memory(),
    }


def _train_step(
    ds, batch, train: TrainConfig, run: RunState, step_tokens: int, last_checkpoint: Optional[Path]
) -> float:
    """One optimizer step on `batch`, counted in `run`; returns its loss. Raises when too many steps
    were skipped."""
    loss = float(
        ds.train_batch(
            iter(micro_batches(batch.tokens, batch.segment_ids, train.micro_batch_size, ds.device))
        )
    )
    run.last_loss = loss
    run.step += 1
    run.tokens += step_tokens
    if not ds.was_step_applied():
        # DeepSpeed (0.19) moves its step counter on past an overflow but not the schedule.
        ds.lr_scheduler.step()
    skipped = not (math.isfinite(loss) and ds.was_step_applied())
    if skipped:
        log.warning(
            "step %d: loss %s or its gradient is not finite; the step was skipped (%d in a row, "
            "%d of the last %d steps)",
            run.step,
            loss,
            run.bad_in_a_row + 1,
            len(run.recent_skips) + 1,
            train.skipped_window,
        )
    too_many = run.count_step(skipped, train)
    if too_many is not None:
        raise StageError(
            f"{too_many} (last: step {run.step}); training stopped. The last good checkpoint is "
            f"{last_checkpoint or 'none'}. Lower train.lr, raise train.warmup_steps or check the "
            "data, then "
            f"run again (it resumes from that checkpoint)."
        )
    return loss


def _stop_on_request(
    stop: StopRequest,
    checkpointing: Optional[Checkpointing],
    run: RunState,
    last_checkpoint: Optional[Path],
) -> None:
    """Raises StageInterrupted, after writing a checkpoint of this step where the run writes
    checkpoints."""
    if checkpointing is None:
        raise StageInterrupted(
            f"training stopped on {stop.received or 'a signal'} at step {run.step}"
        )
    if last_checkpoint is None or not last_checkpoint.name.endswith(f"{run.step:08d}"):
        last_checkpoint = checkpointing.save(run.step)
    raise StageInterrupted(
        f"training stopped on {stop.received or 'a signal of another rank'} at step {run.step} "
        f"after writing {last_checkpoint}; run the same command again to resume."
    )


class MetricsLog:
    """metrics.jsonl and the tensorboard curves beside it, written by the logging rank only."""

    def __init__(self, metrics_file: Path, is_logger: bool) -> None:
        self.file, self.board = metrics_file, None
        if is_logger:
            # Only where it writes: tensorboard's import (boto3 with it) costs every rank half a
            # second.
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(metrics_file.parent / "tensorboard"))

    def record(self, entry: dict) -> None:
        if self.board is None:
            return
        with self.file.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        for key, value in _scalars(entry):
            if key != "step":
                self.board.add_scalar(key, value, entry["step"])

    def flush(self) -> None:
        if self.board is not None:
            self.board.flush()

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def _scalars(entry: dict, prefix: str = ""):
    """(name, number) of each number of a metrics entry, nested ones (the tasks' accuracies) named by
    their path: tasks/<task>/<metric>."""
    for key, value in entry.items():
        if isinstance(value, dict):
            yield from _scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)):
            yield f"{prefix}{key}", value


class Throughput:
    """Tokens per second, model TFLOP/s per device and MFU over the tokens counted since the last
    measure."""

    def __init__(self, flops_per_token: int, world: int) -> None:
        self.flops_per_token, self.world, self.peak = flops_per_token, world, device_peak_tflops()
        self.since, self.tokens = time.perf_counter(), 0

    def measure(self) -> dict:
        now = time.perf_counter()
        speed = self.tokens / (now - self.since)
        self.since, self.tokens = now, 0
        tflops = tflops_per_device(self.flops_per_token, speed, self.world)
        return {
            "tokens_per_s": speed,
            "tflops_per_device": tflops,
            "mfu": None if self.peak is None else tflops / self.peak,
        }


@dataclass
class RunState:
    step: int = 0
    tokens: int = 0
    bad_in_a_row: int = 0
    skipped_steps: int = 0
    # The skipped steps among the last `train.skipped_window`.
    recent_skips: list[int] = field(default_factory=list)
    heldout_bpb_before: Optional[float] = None
    # The in-loop tasks' accuracies before the first step (train.eval_tasks), by task and metric.
    tasks_before: Optional[dict] = None
    # Kept in checkpoints: a run resumed from its last step's checkpoint reports the loss it ended
    # with.
    last_loss: Optional[float] = None

    def as_dict(self) -> dict:
        return {**self.__dict__, "recent_skips": list(self.recent_skips)}

    def count_step(self, skipped: bool, train: TrainConfig) -> Optional[str]:
        """Count the step just taken (`self.step`); returns why the run must stop, or None."""
        if skipped:
            self.bad_in_a_row += 1
            self.skipped_steps += 1
            self.recent_skips.append(self.step)
        else:
            self.bad_in_a_row = 0
        self.recent_skips = [
            step for step in self.recent_skips if step > self.step - train.skipped_window
        ]
        if self.bad_in_a_row >= train.max_bad_steps:
            return f"{self.bad_in_a_row} steps in a row had a non-finite loss or gradient (train.max_bad_steps)"
        # Against the whole window from the start, so that the first few steps of a run do not count
        # double.
        if len(self.recent_skips) > train.max_skipped_fraction * train.skipped_window:
            return (
                f"{len(self.recent_skips)} of the last {train.skipped_window} steps had a "
                "non-finite loss or "
                f"gradient, more than train.max_skipped_fraction={train.max_skipped_fraction}"
            )
        return None


SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    def __init__(self) -> None:
        self.received: str | None = None
        for number in SIGNALS:
            signal.signal(number, self._handle)

    def _handle(self, number, frame) -> None:
        self.received = signal.Signals(number).name

    def agreed(self, device) -> bool:
        """True on every rank if any rank received a signal."""
        flag = torch.tensor([1.0 if self.received else 0.0], device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        for number in SIGNALS:
            signal.signal(number, signal.SIG_DFL)


# Peak dense bf16 TFLOP/s of one device as torch sees it: an MI250X module (383) shows as two GCDs
# of 191.5.
PEAK_TFLOPS = {"MI250X": 191.5, "H100": 989.0, "H200": 989.0, "A100": 312.0}


def device_peak_tflops() -> Optional[float]:
    """The peak of this process's GPU, None on a CPU or an unknown GPU (then MFU is not reported)."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    gcn = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    if "gfx90a" in gcn:
        return PEAK_TFLOPS["MI250X"]
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def tflops_per_device(flops_per_token: int, tokens_per_s: float, devices: int) -> float:
    return flops_per_token * tokens_per_s / devices / 1e12
