"""The typed `pack` section."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError


@dataclass
class PackConfig:
    # Picks which documents are read once more for a fractional epoch (2.5 epochs: a seeded half of
    # the tokens a third time). The training run's sampler has its own seed for the order.
    seed: int = 1
    # Documents per call of the tokenizer (datatrove's DocumentTokenizer batch_size): speed and
    # memory, not results.
    batch_size: int = 1000


def validate_pack(pack: PackConfig) -> None:
    if pack.seed < 0:
        raise ConfigError("pack.seed", pack.seed, ["an integer >= 0"])
    if pack.batch_size < 1:
        raise ConfigError(
            "pack.batch_size",
            pack.batch_size,
            ["a positive number of documents per tokenizer call, e.g. 1000"],
        )
