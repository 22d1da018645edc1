"""The training loop: take a batch from the sampler, step the engine, log, score the held-out text."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from tqdm import tqdm

from pipeline.training.config import TrainConfig
from pipeline.training.engine import Engine
from pipeline.training.heldout import HeldoutWindows, heldout_bpb, micro_batches

log = logging.getLogger(__name__)


def train_loop(engine: Engine, sampler, train: TrainConfig, heldout: HeldoutWindows, metrics_file: Path,
               is_logger: bool) -> dict:
    """`train.steps` optimizer steps; returns the losses, held-out BPB before and after, and speed."""
    ds = engine.engine
    seq_len = sampler.seq_len

    def evaluate(step: int) -> float:
        bpb = heldout_bpb(engine, heldout, train.micro_batch_size, engine.dp_rank, engine.dp_world)
        record({"step": step, "heldout_bpb": bpb})
        return bpb

    def record(entry: dict) -> None:
        if is_logger:
            with metrics_file.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")

    bpb_before = evaluate(0)
    losses, started, tokens_seen = [], time.perf_counter(), 0
    batches = iter(sampler)
    progress = tqdm(total=train.steps, desc="training", unit="step", disable=not is_logger)
    window_start, window_tokens = time.perf_counter(), 0
    for step in range(1, train.steps + 1):
        batch = next(batches)
        loss = float(ds.train_batch(iter(micro_batches(batch.tokens, batch.segment_ids, train.micro_batch_size,
                                                       ds.device))))
        losses.append(loss)
        step_tokens = train.global_batch_size * seq_len
        tokens_seen += step_tokens
        window_tokens += step_tokens
        progress.update(1)
        if step % train.log_every == 0 or step == train.steps:
            now = time.perf_counter()
            speed = window_tokens / (now - window_start)
            window_start, window_tokens = now, 0
            lr = ds.get_lr()[0]
            record({"step": step, "loss": loss, "lr": lr, "tokens": tokens_seen, "tokens_per_s": speed})
            progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
        if train.eval_every and step % train.eval_every == 0 and step != train.steps:
            evaluate(step)
        if not math.isfinite(loss):
            raise FloatingPointError(f"the training loss became {loss} at step {step}; lower train.lr or check the data")
    progress.close()
    seconds = time.perf_counter() - started
    bpb_after = evaluate(train.steps)
    return {"steps": train.steps, "tokens": tokens_seen, "first_loss": losses[0], "last_loss": losses[-1],
            "heldout_bpb_before": bpb_before, "heldout_bpb_after": bpb_after, "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens_seen / seconds, 1), "sampler": sampler.state_dict()}
