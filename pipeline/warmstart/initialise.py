"""The warm-started model: the base model's body with embedding rows (and an untied head) for the new vocabulary."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tokenizers import Tokenizer

from pipeline.model.transformer import Transformer
from pipeline.tokenization.folder import ROLES, special_token_strings, token_roles
from pipeline.warmstart.transfer import build_matrix, plan_rows


def warm_started(base: Transformer, base_folder: Path, base_tokenizer: Tokenizer, new_folder: Path,
                 new_tokenizer: Tokenizer, method: str, seed: int) -> tuple[Transformer, dict]:
    """A model for `new_tokenizer`: every body tensor the base's own, new embedding (and untied head) rows
    by `method` (transfer.py). Returns it and how many rows were copied, averaged, special or random."""
    named = special_token_strings(new_folder, ROLES)
    new_roles = {role: new_tokenizer.token_to_id(token) for role, token in named.items()
                 if new_tokenizer.token_to_id(token) is not None}
    sources = plan_rows(new_tokenizer, base_tokenizer, new_roles, token_roles(base_folder, base_tokenizer))
    vocab = new_tokenizer.get_vocab_size(with_added_tokens=True)
    cfg = dataclasses.replace(base.cfg, vocab_size=vocab)
    model = Transformer(cfg)
    body = {k: v for k, v in base.state_dict().items() if not k.startswith(("embedding.tokens.", "head."))}
    model.load_state_dict(body, strict=False)
    generator = torch.Generator().manual_seed(seed)
    report = {}
    matrices = [("embedding", base.embedding.tokens.weight[:base.cfg.vocab_size], model.embedding.tokens.weight)]
    if not cfg.tie_embeddings:
        matrices.append(("head", base.head.weight[:base.cfg.vocab_size], model.head.weight))
    with torch.no_grad():
        for name, old, new in matrices:
            rows, counts = build_matrix(old, vocab, sources, method, generator)
            new.zero_()  # the padding rows stay zero
            new[:vocab] = rows
            report[name] = counts
    model.tie_weights()
    return model, report
