"""The models the evaluate stage scores, each with its own tokenizer and the windows that fit it:
bits per byte on a held-out set (bits_per_byte.py), what its added tokens take there, the downstream
tasks (task_scoring.py), a training stage's own held-out rows scored again, and greedy continuations
of held-out prompts (generation.py)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import (
    Score,
    ScoringRows,
    score_documents,
    score_rows,
)
from pipeline.evaluation.eval_config import EvalConfig
from pipeline.evaluation.generation import greedy_continuation
from pipeline.evaluation.report import reproduction_line
from pipeline.evaluation.task_files import Task
from pipeline.evaluation.task_scoring import Accuracy, ScoringModel, score_task
from pipeline.evaluation.texts import TextSet
from pipeline.model.model_config import training_seq_len
from pipeline.model.files import check_finite, load_base
from pipeline.model.transformer import Transformer
from pipeline.progress import Progress
from pipeline.tokenization.folder import load_tokenizer, token_roles

log = logging.getLogger(__name__)

# The exported model rescoring its training stage's own held-out rows may differ from the number the
# stage logged by rounding only (bf16 on a GPU, other batches): more than this share is a
# disagreement between the two computations.
REPRODUCTION_TOLERANCE = 0.02


@dataclass(frozen=True)
class ModelToScore:
    """A model folder (Hugging Face, with its tokenizer) under its name: `base`, or the training
    stage that made it."""

    name: str
    folder: str
    # A trained model's: the held-out bits per byte its stage logged, its stage's held-out rows
    # (read when asked: the training stage's heldout.npz; only with a logged score, which they
    # reproduce), training curves (metrics.jsonl) and its
    # marker's metrics (what training took); None where there are none.
    logged_bpb: Optional[float] = None
    rows: Optional[Callable[[], ScoringRows]] = None
    curves: Optional[Path] = None
    training: Optional[dict] = None


@dataclass
class LoadedModel:
    """A model ready to score, with its own tokenizer and the windows that fit it."""

    name: str
    folder: str
    model: Transformer
    tokenizer: object
    start_id: int
    eos_id: Optional[int]  # where a continuation stops
    seq_len: int
    stride: int


def load_model(
    name: str, folder: str, evaluation: EvalConfig, lang: str, device: torch.device
) -> LoadedModel:
    model = load_base(folder)
    check_finite(
        model,
        f"evaluate {lang}: the {name} model in {folder}",
        "it is not scored. Train it again (or give model.base a sound model).",
    )
    model = model.to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    tokenizer = load_tokenizer(folder)
    roles = token_roles(Path(folder), tokenizer)
    start_id = roles[evaluation.document_start]
    if start_id is None:
        raise StageError(
            f"evaluate: the tokenizer of {folder} has no {evaluation.document_start} token; set "
            f"eval.document_start to the token its model saw before documents (eos or bos)."
        )
    # null: the length the training stages train at by default, so that every model is scored as it
    # trained
    seq_len = min(training_seq_len(model.cfg, evaluation.seq_len), model.cfg.max_seq_len)
    stride = min(evaluation.stride or max(1, seq_len // 2), seq_len)
    return LoadedModel(name, folder, model, tokenizer, start_id, roles["eos"], seq_len, stride)


def score_set(
    loaded: LoadedModel,
    text_set: TextSet,
    texts: list[str],
    batch_size: int,
    lang: str,
    device,
    first_added: int | None = None,
) -> Score:
    """The model's score on the set; with `first_added`, what its added tokens take there too
    (score_rows)."""
    # Lines with a rate that a Slurm log keeps, as every long stage writes them (no total: the
    # tokens are counted as the set is tokenized).
    with Progress(
        f"evaluate {lang}: {loaded.name} on {text_set.name}", None, "tokens", log
    ) as progress:
        score = score_documents(
            loaded.model,
            loaded.tokenizer,
            texts,
            loaded.start_id,
            loaded.seq_len,
            loaded.stride,
            batch_size,
            device,
            progress,
            first_added,
        )
    if not math.isfinite(score.bits_per_byte):
        raise StageError(
            f"evaluate {lang}: the {loaded.name} model in {loaded.folder} scores "
            f"{score.bits_per_byte} bits per byte on {text_set.where}: its outputs overflow. No "
            "report "
            f"is written; check the model (and eval.seq_len against the length it was trained on)."
        )
    log.info(
        "evaluate %s: %s on %s: %.4f bits per byte (token perplexity %.2f, %d tokens over %d bytes)",
        lang,
        loaded.name,
        text_set.name,
        score.bits_per_byte,
        score.token_perplexity,
        score.tokens,
        score.bytes,
    )
    if score.added is not None:
        log.info(
            "evaluate %s: %s on %s: the added tokens take %.2f%% of the probability where a base "
            "token is the "
            "target; %d of %d targets are added tokens",
            lang,
            loaded.name,
            text_set.name,
            100 * score.added["mass"],
            score.added["added_targets"],
            score.added["base_targets"] + score.added["added_targets"],
        )
    return score


def first_added_id(base_vocab: dict[str, int] | None, tokenizer) -> int | None:
    """The first added id where `tokenizer` extends the base's (every base token at its own id, more
    after it, as tokenizer.extend_base makes it); None for another tokenizer or without a base."""
    if base_vocab is None:
        return None
    vocab = tokenizer.get_vocab()
    if len(vocab) <= len(base_vocab) or any(
        vocab.get(token) != token_id for token, token_id in base_vocab.items()
    ):
        return None
    return max(base_vocab.values()) + 1


def reproduce_training_score(
    model: ModelToScore, loaded: LoadedModel, batch_size: int, lang: str, device
) -> dict | None:
    """The training stage's own held-out rows (the same documents, windows and start token it
    scored) scored by the exported model the way evaluate scores: the stage's logged
    heldout_bpb_after again, unless something differs between the training engine and the exported
    model. None for the base, or an output without the rows."""
    if model.rows is None:
        return None
    logged, rows = model.logged_bpb, model.rows()
    rescored = score_rows(loaded.model, rows, batch_size, device).bits_per_byte
    result = {
        "logged": logged,
        "rescored": rescored,
        "seq_len": int(rows.inputs.shape[1]),
        "tokens": rows.tokens,
        "bytes": rows.bytes,
        "documents": rows.documents,
        "agree": abs(rescored - logged) <= REPRODUCTION_TOLERANCE * logged,
    }
    if result["agree"]:
        log.info("evaluate %s: %s", lang, reproduction_line(loaded.name, result))
    else:
        log.warning("evaluate %s: %s", lang, reproduction_line(loaded.name, result))
    return result


def score_tasks(
    loaded: LoadedModel, tasks: list[Task], batch_size: int, lang: str, device
) -> dict[str, dict[str, Accuracy]]:
    """Each task's accuracy under each of its scorings."""
    scorer = ScoringModel(
        loaded.model, loaded.tokenizer, loaded.start_id, loaded.seq_len, batch_size, device
    )
    results = {}
    for task in tasks:
        accuracies = score_task(scorer, task)
        results[task.name] = accuracies
        log.info(
            "evaluate %s: %s on the %s task: %s",
            lang,
            loaded.name,
            task.name,
            ", ".join(
                f"{scoring} {accuracy.accuracy:.3f} (n={accuracy.n}, chance {accuracy.chance:.3f})"
                for scoring, accuracy in accuracies.items()
            ),
        )
    return results


def continuations(loaded: LoadedModel, prompts: list[str], device) -> list[str]:
    """The model's greedy continuation of each prompt (generation.py), read with its own
    tokenizer."""
    return [
        greedy_continuation(
            loaded.model,
            loaded.tokenizer,
            prompt,
            loaded.start_id,
            loaded.eos_id,
            loaded.seq_len,
            device,
        )
        for prompt in prompts
    ]
