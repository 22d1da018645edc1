"""The warm-started model: the base model's body with embedding rows (and an untied head) for the
new vocabulary, and which of its parameters the warmup trains.

`warm_start` is the warmup stage's one call: it reads the base model and its tokenizer, checks that
they fit the configured model and builds the new rows (transfer.py). What that cost, wall seconds
and peak memory, goes into the warmup report: memory is the process's resident set (RSS), sampled
every few milliseconds from /proc while the work runs, so that it counts what native code
(tokenizers, torch) holds, not only Python objects (null where /proc is missing).

The warmup trains always the input embeddings; the untied LM head unless `warmup.train_head=false`
(a tied head is the embedding); `warmup.train_embedding_norm=true` adds BLOOM's LayerNorm after the
embedding. (Training every norm too made SmolLM2's English 2.8% worse: docs/benchmark-log.md, "The
warm start with the norms trained"; the option is gone.) Every other tensor (the transformer body)
stays frozen, bit for bit. They are given as parameter-name prefixes, which the training job
(pipeline/training/job.py) carries to the ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import torch
from tokenizers import Tokenizer

from pipeline.model.model_config import ModelConfig
from pipeline.model.files import base_tensors, check_fit
from pipeline.model.model_tensors import StartingModel, ModelTensors, ReplacedTensors, model_shapes
from pipeline.tokenization.folder import load_tokenizer, ROLES, special_token_strings, token_roles
from pipeline.warmup.warmup_config import WarmupConfig
from pipeline.warmup.transfer import METHODS, TransferPlan, build_matrix, plan_rows

log = logging.getLogger(__name__)


def transfer_plan(
    base_folder: Path,
    base_tokenizer: Tokenizer,
    new_folder: Path,
    new_tokenizer: Tokenizer,
    method: str,
) -> Optional[TransferPlan]:
    """Where each new row comes from under `method` (None for `random`)."""
    if method not in METHODS:
        raise ValueError(
            f"warmup.init={method!r} is not a known initialisation; choose one of "
            f"{', '.join(METHODS)}"
        )
    if method == "random":
        return None
    named = special_token_strings(new_folder, ROLES)
    new_roles = {
        role: new_tokenizer.token_to_id(token)
        for role, token in named.items()
        if new_tokenizer.token_to_id(token) is not None
    }
    return plan_rows(
        new_tokenizer, base_tokenizer, new_roles, token_roles(base_folder, base_tokenizer)
    )


def warm_started(
    base: ModelTensors,
    base_folder: Path,
    base_tokenizer: Tokenizer,
    new_folder: Path,
    new_tokenizer: Tokenizer,
    method: str,
    seed: int,
) -> tuple[ReplacedTensors, dict]:
    """A model for `new_tokenizer`: every body tensor the base's own, new embedding (and untied
    head) rows by `method` (transfer.py). Only the base's vocabulary matrices are read here; the
    body is read when the result is (a tensor at a time).

    Returns the model's tensors and the transfer summary: how many rows of each kind each matrix
    got, how many lead at the base's ids (`base_rows`), and what it cost (`cost`: seconds and peak
    memory).
    """
    with measured() as cost:
        plan = transfer_plan(base_folder, base_tokenizer, new_folder, new_tokenizer, method)
        vocab = new_tokenizer.get_vocab_size(with_added_tokens=True)
        cfg = dataclasses.replace(base.cfg, vocab_size=vocab)
        shapes = model_shapes(cfg)
        generator = torch.Generator().manual_seed(seed)
        summary = {"method": method}
        matrices = [("embedding", "embedding.tokens.weight")]
        if not cfg.tie_embeddings:
            matrices.append(("head", "head.weight"))
        replaced = {}
        with base, torch.no_grad():
            for kind, name in matrices:
                rows, counts = build_matrix(
                    base.read(name)[: base.cfg.vocab_size], vocab, plan, method, generator
                )
                matrix = torch.zeros(shapes[name], dtype=rows.dtype)  # the padding rows stay zero
                matrix[:vocab] = rows
                replaced[name] = matrix
                summary[kind] = counts
    summary["cost"] = cost
    summary["base_rows"] = leading_base_rows(plan)
    return ReplacedTensors(base, cfg, replaced), summary


def leading_base_rows(plan: Optional[TransferPlan]) -> int:
    """How many rows from id 0 on are the base's own, at the base's id (an extended base tokenizer:
    all of the base's); 0 for a tokenizer that moved them, or under `random`."""
    rows = 0
    while (
        plan is not None
        and rows in plan.rows
        and plan.rows[rows].old_ids == (rows,)
        and plan.rows[rows].kind in ("copied", "special")
    ):
        rows += 1
    return rows


def warmup_trainable(train_head: bool, train_embedding_norm: bool) -> list[str]:
    prefixes = ["embedding.tokens."]
    if train_head:
        prefixes.append("head.")
    if train_embedding_norm:
        prefixes.append("embedding.norm.")
    return prefixes


STATM = Path("/proc/self/statm")
SAMPLE_SECONDS = 0.005


def resident_bytes() -> Optional[int]:
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def measured() -> Iterator[dict]:
    """Fills the dict it yields with `seconds`, `peak_rss_mib` and `peak_added_mib` (above the
    start)."""
    cost: dict = {}
    start_rss = resident_bytes()
    peak = [start_rss or 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            peak[0] = max(peak[0], resident_bytes() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    if start_rss is not None:
        sampler.start()
    try:
        yield cost
    finally:
        done.set()
        if start_rss is not None:
            sampler.join()
            peak[0] = max(peak[0], resident_bytes() or 0)
        cost["seconds"] = round(time.perf_counter() - started, 3)
        cost["peak_rss_mib"] = round(peak[0] / 2**20, 1) if start_rss is not None else None
        cost["peak_added_mib"] = (
            round((peak[0] - start_rss) / 2**20, 1) if start_rss is not None else None
        )


def warm_start(
    model: ModelConfig, warmup: WarmupConfig, tokenizer_dir: Path, tokenizer: Tokenizer, lang: str
) -> tuple[StartingModel, dict]:
    """The warmup's starting model for the new tokenizer (`tokenizer_dir`) from the base model
    `model.base`, which must fit the configured model; returns it with the transfer summary
    (warm_started)."""
    base = base_tensors(model.base)
    base_tokenizer = load_tokenizer(model.base)
    check_fit(model, base.cfg, model.base, base_tokenizer)
    initial, transfer = warm_started(
        base,
        Path(model.base),
        base_tokenizer,
        tokenizer_dir,
        tokenizer,
        warmup.init,
        warmup.train.seed,
    )
    log.info(
        "warmup %s: %s initialisation of %d rows in %.1f s: %s",
        lang,
        warmup.init,
        initial.cfg.vocab_size,
        transfer["cost"]["seconds"],
        transfer["embedding"],
    )
    return StartingModel(
        initial,
        f"warmup: the base model {model.base}",
        "a warm start from it cannot train. Give a sound model.base.",
    ), transfer
