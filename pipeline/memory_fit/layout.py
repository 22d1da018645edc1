"""A training layout and its arithmetic: ranks, micro-batches in flight, pipeline bubble, tokens per
step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    # Micro-batches per optimizer step on each pipeline (DeepSpeed's gradient accumulation steps).
    accumulation: int
    seq_len: int
    # Blocks per recomputed chunk (train.activation_checkpoint_interval); 0 keeps every activation.
    checkpoint_interval: int = 0

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.accumulation

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def bubble(self) -> float:
        """Idle share of a 1F1B pipeline step: (pp - 1) / (m + pp - 1) for m micro-batches."""
        return (self.pp - 1) / (self.accumulation + self.pp - 1)

    def in_flight(self, stage: int) -> int:
        """Micro-batches whose activations stage `stage` holds at once under 1F1B: those it has run
        forward and not yet backward, up to `pp - stage` (the first stage waits longest for its
        gradients)."""
        return min(self.pp - stage, self.accumulation)

    def describe(self) -> str:
        return f"tp={self.tp} x pp={self.pp} x dp={self.dp}"


def blocks_per_stage(num_layers: int, pp: int) -> list[int]:
    """Transformer blocks of each pipeline stage, as DeepSpeed's `type:BlockLayer` partition
    balances them: the first `num_layers % pp` stages get one more."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp={pp} must be between 1 and the model's {num_layers} blocks")
    base, extra = divmod(num_layers, pp)
    return [base + (1 if stage < extra else 0) for stage in range(pp)]
