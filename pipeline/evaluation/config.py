"""The typed `eval` section: which held-out text, in which windows."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from pipeline.errors import ConfigError

EVAL_DOCUMENT_STARTS = ("eos", "bos")


@dataclass
class EvalConfig:
    # Held-out text: null takes the clean stage's held-out split; or a file or folder of JSONL/Parquet (the
    # clean reader's formats) or of plain text, one document per line (FLORES' `nob_Latn.devtest`).
    path: Optional[str] = None
    # Held-out text of the base model's language (model.base_lang), to see whether the model forgets it: null
    # takes the held-out split of `${work_dir}/<model.base_lang>/clean` when that clean stage is done; or a file or
    # folder as for `path`.
    base_lang_path: Optional[str] = None
    # Tokens per window; null: the model's context, at most 2048, as training takes it (model/config.py).
    seq_len: Optional[int] = None
    # Tokens scored per window after the first; the rest of the window is context. Null: half the window.
    stride: Optional[int] = None
    # The token fed before each document's first token: `eos`, as the pack stage separates documents (and
    # BLOOM was trained), or `bos` for models trained with one (Llama 3).
    document_start: str = "eos"
    # Cap on the UTF-8 bytes evaluated per held-out set (whole documents, in order).
    max_bytes: int = 10_000_000
    # Windows per forward pass.
    batch_size: int = 8


def validate_eval(evaluation: EvalConfig) -> None:
    if evaluation.path is not None and not os.path.exists(evaluation.path):
        raise ConfigError("eval.path", evaluation.path, ["null (the clean stage's held-out split)",
                                                         "an existing file or folder of held-out text"])
    if evaluation.base_lang_path is not None and not os.path.exists(evaluation.base_lang_path):
        raise ConfigError("eval.base_lang_path", evaluation.base_lang_path, [
            "null (the held-out split of <work_dir>/<model.base_lang>/clean, when that clean stage is done)",
            "an existing file or folder of held-out text in the base model's language"])
    for key in ("seq_len", "stride"):
        value = getattr(evaluation, key)
        if value is not None and value < 1:
            raise ConfigError(f"eval.{key}", value, ["null", "an integer >= 1"])
    if evaluation.seq_len is not None and evaluation.stride is not None and evaluation.stride > evaluation.seq_len:
        raise ConfigError("eval.stride", evaluation.stride, [f"at most eval.seq_len ({evaluation.seq_len})"])
    if evaluation.document_start not in EVAL_DOCUMENT_STARTS:
        raise ConfigError("eval.document_start", evaluation.document_start, EVAL_DOCUMENT_STARTS)
    for key in ("max_bytes", "batch_size"):
        if getattr(evaluation, key) < 1:
            raise ConfigError(f"eval.{key}", getattr(evaluation, key), ["an integer >= 1"])
