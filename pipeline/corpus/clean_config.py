"""The typed `clean` section: language ID, quality filters, deduplication and the held-out split."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional

from pipeline.errors import ConfigError


@dataclass
class LanguageIdConfig:
    # A local GlotLID (or other fastText) model file. None: trust the corpus' own `lang` field.
    model: Optional[str] = None
    # Minimum score; None takes the language's `filters.language_score`.
    threshold: Optional[float] = None


@dataclass
class DedupConfig:
    enabled: bool = True
    n_grams: int = 5
    num_buckets: int = 14
    hashes_per_bucket: int = 8
    seed: int = 1


@dataclass
class CleanConfig:
    lid: LanguageIdConfig = field(default_factory=LanguageIdConfig)
    gopher_repetition: bool = True
    gopher_quality: bool = True
    fineweb_quality: bool = True
    c4: bool = False
    gopher_min_doc_words: int = 50
    dedup: DedupConfig = field(default_factory=DedupConfig)
    # Glob patterns of raw files (their path below `${raw_dir}/<lang>/`, or their name) or of
    # records' `source` field: every matching document is cleaned alike but goes to
    # `heldout_source/`, never to training, so that evaluate can score a source the model never saw.
    # Null: the language table's `heldout_sources` (nob: UD and regjeringen.no text), read when the
    # stage runs, so that a run that cleans another language (the base's, the demo's) takes that
    # language's.
    heldout_sources: Optional[List[str]] = None
    heldout_fraction: float = 0.02
    # Held-out documents at least (the kept ones with the smallest id hashes), however small the
    # fraction's share: a small language still gets text to evaluate on. Never more than a quarter
    # of the kept documents.
    heldout_min_documents: int = 10
    # Output shards hold this many bytes of JSON lines (before compression); -1: one shard per folder.
    shard_bytes: int = 256 * 2**20
    # The most of one raw record the reader holds (a JSONL line, or a Parquet record's text): a
    # longer one is a bad record, `record_too_long`, skipped unread, so a broken dump's one-line
    # hundreds of MB cannot exhaust memory. 64 MiB is thousands of times a web page's text and more
    # than a long book's: no real document is that long.
    max_record_bytes: int = 64 * 2**20
    # datatrove tasks (units of work, each an equal share of the input's bytes); None: as many as
    # workers. Neither changes the output, only how fast it comes.
    tasks: Optional[int] = None
    # A raw file larger than one task's share is read in parts, by several tasks, each part at
    # least this many bytes on disk: a task's start (language-ID model, word tokenizers) costs
    # seconds, a MiB of compressed text keeps the filters busy many times longer.
    min_part_bytes: int = 2**20


def heldout_source_patterns(clean: CleanConfig, lang) -> List[str]:
    """The raw-file patterns held out whole: `clean.heldout_sources`, or for null the language
    table's."""
    return list(lang.heldout_sources if clean.heldout_sources is None else clean.heldout_sources)


def no_heldout_advice(clean: CleanConfig) -> str:
    """What to do when the clean stage held out nothing, given its settings: never a setting in
    force."""
    if clean.heldout_fraction == 0 and clean.heldout_min_documents == 0:
        return "run clean with clean.heldout_fraction > 0 or clean.heldout_min_documents > 0."
    return (
        f"with clean.heldout_fraction={clean.heldout_fraction:g} and clean.heldout_min_documents="
        f"{clean.heldout_min_documents}, the clean stage kept too few documents to hold any out: "
        "add text to the "
        "language's raw folder, or give eval text to stage=evaluate with eval.path=."
    )


def validate_clean(clean: CleanConfig) -> None:
    if not 0.0 <= clean.heldout_fraction < 1.0:
        raise ConfigError("clean.heldout_fraction", clean.heldout_fraction, ["a number in [0, 1)"])
    if clean.heldout_min_documents < 0:
        raise ConfigError(
            "clean.heldout_min_documents", clean.heldout_min_documents, ["an integer >= 0"]
        )
    for pattern in clean.heldout_sources or []:
        if not isinstance(pattern, str) or not pattern.strip():
            raise ConfigError(
                "clean.heldout_sources",
                list(clean.heldout_sources),
                [
                    "a list of glob patterns of raw file names or records' source, e.g. "
                    "[regjeringen_*]",
                    "[] for none",
                ],
            )
    if clean.max_record_bytes < 1:
        raise ConfigError(
            "clean.max_record_bytes", clean.max_record_bytes, ["an integer >= 1 (bytes)"]
        )
    if clean.tasks is not None and clean.tasks < 1:
        raise ConfigError("clean.tasks", clean.tasks, ["null", "an integer >= 1"])
    if clean.min_part_bytes < 1:
        raise ConfigError("clean.min_part_bytes", clean.min_part_bytes, ["an integer >= 1 (bytes)"])
    if clean.lid.model is not None and not os.path.isfile(clean.lid.model):
        raise ConfigError(
            "clean.lid.model", clean.lid.model, ["a path to a local fastText/GlotLID .bin file"]
        )
