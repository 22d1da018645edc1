"""The warm-started model: the base model's body with embedding rows (and an untied head) for the new vocabulary."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Optional

import torch
from tokenizers import Tokenizer

from pipeline.model.model_tensors import ModelTensors, ReplacedTensors, model_shapes
from pipeline.tokenization.folder import ROLES, special_ids, special_token_strings, token_roles
from pipeline.warmstart.align import align_rows
from pipeline.warmstart.cost import measured
from pipeline.warmstart.focus import focus_rows
from pipeline.warmstart.transfer import METHODS, TransferPlan, build_matrix, needs_text, plan_rows
from pipeline.warmstart.transfer_text import token_sequences


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
    return ReplacedTensors(base, cfg, replaced), summary
