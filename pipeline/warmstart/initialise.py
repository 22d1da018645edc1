"""The warm-started model: the base model's body with embedding rows (and an untied head) for the new vocabulary,
and which of its parameters the warmup trains.

`warm_start` is the warmup stage's one call: it reads the base model and its tokenizer, checks that they fit the
configured model, reads the text that `focus` and `align` learn from (the start of the clean stage's training
text, bounded by `warmup.transfer_bytes` so that a sweep over many languages spends seconds here, not hours, and
read in file order, so that the same configuration always learns from the same documents) and builds the new rows
(transfer.py). What that cost, wall seconds and peak memory, goes into the warmup report: memory is the process's
resident set (RSS), sampled every few milliseconds from /proc while the work runs, so that it counts what native
code (fastText, tokenizers, torch) holds, not only Python objects (null where /proc is missing).

The warmup trains always the input embeddings; the untied LM head unless `warmup.train_head=false` (a tied head
is the embedding); `warmup.train_embedding_norm=true` adds BLOOM's LayerNorm after the embedding. (Training every
norm too made SmolLM2's English 2.8% worse: docs/benchmark-log.md, "The warm start with the norms trained"; the
option is gone.) Every other tensor (the transformer body)
stays frozen, bit for bit. They are given as parameter-name prefixes, which the training job
(pipeline/training/job.py) carries to the ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from tokenizers import Tokenizer

from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError
from pipeline.model.config import ModelConfig
from pipeline.model.files import base_tensors, check_fit
from pipeline.model.model_tensors import StartingModel, ModelTensors, ReplacedTensors, model_shapes
from pipeline.tokenization.folder import load_tokenizer, ROLES, special_ids, special_token_strings, token_roles
from pipeline.warmstart.align import align_rows
from pipeline.warmstart.config import WarmupConfig
from pipeline.warmstart.focus import focus_rows
from pipeline.warmstart.transfer import METHODS, TransferPlan, build_matrix, needs_text, plan_rows

log = logging.getLogger(__name__)


def transfer_plan(base_folder: Path, base_tokenizer: Tokenizer, new_folder: Path, new_tokenizer: Tokenizer,
                  method: str, seed: int, texts: Optional[list[str]]) -> tuple[Optional[TransferPlan], dict]:
    """Where each new row comes from under `method` (None for `random`), and what the method learnt from."""
    if method not in METHODS:
        raise ValueError(f"warmup.init={method!r} is not a known initialisation; choose one of {', '.join(METHODS)}")
    if needs_text(method) and not texts:
        raise ValueError(f"warmup.init={method} learns from text of the language: pass `texts` (the stage reads "
                         f"warmup.transfer_bytes of the clean stage's training text).")
    if method == "random":
        return None, {}
    named = special_token_strings(new_folder, ROLES)
    new_roles = {role: new_tokenizer.token_to_id(token) for role, token in named.items()
                 if new_tokenizer.token_to_id(token) is not None}
    plan = plan_rows(new_tokenizer, base_tokenizer, new_roles, token_roles(base_folder, base_tokenizer))
    new_sequences = token_sequences(new_tokenizer, texts) if needs_text(method) else []
    if method == "focus":
        with tempfile.TemporaryDirectory(prefix="focus-") as scratch:
            return plan, focus_rows(plan, new_tokenizer, new_sequences, Path(scratch))
    if method == "align":
        return plan, align_rows(plan, new_sequences, token_sequences(base_tokenizer, texts),
                                new_tokenizer.get_vocab_size(with_added_tokens=True),
                                base_tokenizer.get_vocab_size(with_added_tokens=True), special_ids(base_tokenizer),
                                seed)
    return plan, {}


def warm_started(base: ModelTensors, base_folder: Path, base_tokenizer: Tokenizer, new_folder: Path,
                 new_tokenizer: Tokenizer, method: str, seed: int,
                 texts: Optional[list[str]] = None) -> tuple[ReplacedTensors, dict]:
    """A model for `new_tokenizer`: every body tensor the base's own, new embedding (and untied head) rows by
    `method` (transfer.py), which for `focus` and `align` learns from `texts` of the language. Only the base's
    vocabulary matrices are read here; the body is read when the result is (a tensor at a time).

    Returns the model's tensors and the transfer summary: how many rows of each kind each matrix got, what the
    method learnt from (`learnt_from`), and what it cost (`cost`: seconds and peak memory, text tokenization
    included).
    """
    with measured() as cost:
        plan, learnt = transfer_plan(base_folder, base_tokenizer, new_folder, new_tokenizer, method, seed, texts)
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
                rows, counts = build_matrix(base.read(name)[:base.cfg.vocab_size], vocab, plan, method, generator)
                matrix = torch.zeros(shapes[name], dtype=rows.dtype)  # the padding rows stay zero
                matrix[:vocab] = rows
                replaced[name] = matrix
                summary[kind] = counts
    summary["learnt_from"] = learnt
    summary["cost"] = cost
    summary["base_rows"] = leading_base_rows(plan)
    return ReplacedTensors(base, cfg, replaced), summary


def leading_base_rows(plan: Optional[TransferPlan]) -> int:
    """How many rows from id 0 on are the base's own, at the base's id (an extended base tokenizer: all of the
    base's); 0 for a tokenizer that moved them, or under `random`."""
    rows = 0
    while plan is not None and rows in plan.rows and plan.rows[rows].old_ids == (rows,) \
            and plan.rows[rows].kind in ("copied", "special"):
        rows += 1
    return rows


def warmup_trainable(train_head: bool, train_embedding_norm: bool) -> list[str]:
    prefixes = ["embedding.tokens."]
    if train_head:
        prefixes.append("head.")
    if train_embedding_norm:
        prefixes.append("embedding.norm.")
    return prefixes


def read_transfer_text(clean_dir: Path, lang: str, max_bytes: int, scratch: Path) -> list[str]:
    """Whole documents of the clean stage's training split up to `max_bytes` of UTF-8 (the last one cut)."""
    source = clean_output(lang, clean_dir, split="train")
    texts, size = [], 0
    for document in read_documents(source, scratch):
        if size >= max_bytes:
            break
        data = document.text.encode("utf-8")[:max_bytes - size]
        texts.append(data.decode("utf-8", errors="ignore"))
        size += len(data)
    shutil.rmtree(scratch, ignore_errors=True)
    if not size:
        raise StageError(f"warmup: {clean_dir}/train holds no training text for the embedding transfer to learn from. "
                         f"Run the clean stage again (python -m pipeline stage=clean lang={lang}), or choose "
                         f"warmup.init=mean, which needs no text.")
    return texts


def token_sequences(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each document's token ids (no special tokens), as int64 arrays."""
    return [np.asarray(encoding.ids, dtype=np.int64)
            for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]


STATM = Path("/proc/self/statm")
SAMPLE_SECONDS = 0.005


def resident_bytes() -> Optional[int]:
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def measured() -> Iterator[dict]:
    """Fills the dict it yields with `seconds`, `peak_rss_mib` and `peak_added_mib` (above the start)."""
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
        cost["peak_added_mib"] = round((peak[0] - start_rss) / 2**20, 1) if start_rss is not None else None


def warm_start(model: ModelConfig, warmup: WarmupConfig, tokenizer_dir: Path, tokenizer: Tokenizer, clean_dir: Path,
               lang: str, scratch: Path) -> tuple[StartingModel, dict]:
    """The warmup's starting model for the new tokenizer (`tokenizer_dir`) from the base model `model.base`, which
    must fit the configured model; returns it with the transfer summary (warm_started)."""
    base = base_tensors(model.base)
    base_tokenizer = load_tokenizer(model.base)
    check_fit(model, base.cfg, model.base, base_tokenizer)
    texts = read_transfer_text(clean_dir, lang, warmup.transfer_bytes, scratch) if needs_text(warmup.init) else None
    initial, transfer = warm_started(base, Path(model.base), base_tokenizer, tokenizer_dir, tokenizer, warmup.init,
                                     warmup.train.seed, texts=texts)
    log.info("warmup %s: %s initialisation of %d rows in %.1f s: %s", lang, warmup.init, initial.cfg.vocab_size,
             transfer["cost"]["seconds"], transfer["embedding"])
    return StartingModel(initial, f"warmup: the base model {model.base}",
                         "a warm start from it cannot train. Give a sound model.base."), transfer
