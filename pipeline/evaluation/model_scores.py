"""Every model scored on every held-out set and task, with its continuations of the held-out
prompts: the models spread over the visible GPUs, one process each (on a CPU, over `workers`
processes), one model in memory at a time on each.

A process of its own per device, not threads: the models are small next to a GPU, so scoring is
limited by the host's launches, which one Python process serialises. The scores do not depend on
the spread: each model is scored whole on one device, as it would be alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch

from pipeline.evaluation.eval_config import EvalConfig
from pipeline.evaluation.models import (
    ModelToScore,
    continuations,
    first_added_id,
    load_model,
    reproduce_training_score,
    score_set,
    score_tasks,
)
from pipeline.evaluation.task_files import Task
from pipeline.evaluation.texts import TextSet
from pipeline.evaluation.uncertainty import bits_per_byte_interval
from pipeline.tokenization.folder import load_tokenizer

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """What the models scored, each by model name (the base first)."""

    # [model][set]: the Score's figures, the window and the 95% bootstrap interval of bits per byte
    scores: dict = field(default_factory=dict)
    # [model][set]: (nats, UTF-8 bytes) per document, for the paired comparisons
    documents: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)  # [model][task][scoring]: Accuracy
    reproduced: dict = field(default_factory=dict)  # the training held-out score rescored
    added: dict = field(default_factory=dict)  # what the added tokens take of the base_set
    continuations: dict = field(default_factory=dict)  # [model]: one per prompt


@dataclass(frozen=True)
class Scoring:
    """What every model is scored on, the same in every process."""

    sets: dict[str, TextSet]
    texts: dict[str, list[str]]
    tasks: list[Task]
    base_set: Optional[str]  # where the added tokens' share is measured
    base_vocab: Optional[dict[str, int]]  # the base's tokens: which of a model's were added
    prompts: list[str]
    evaluation: EvalConfig
    lang: str


def score_model(model: ModelToScore, scoring: Scoring, device: torch.device) -> dict:
    """One model's part of `Scored`, by field."""
    loaded = load_model(model.name, model.folder, scoring.evaluation, scoring.lang, device)
    batch = scoring.evaluation.batch_size
    added_from = (
        None if model.name == "base" else first_added_id(scoring.base_vocab, loaded.tokenizer)
    )
    by_set = {
        set_name: score_set(
            loaded,
            text_set,
            scoring.texts[set_name],
            batch,
            scoring.lang,
            device,
            added_from if set_name == scoring.base_set else None,
        )
        for set_name, text_set in scoring.sets.items()
    }
    base_set = by_set.get(scoring.base_set)
    return {
        "scores": {
            set_name: {
                **score.as_dict(),
                "seq_len": loaded.seq_len,
                "stride": loaded.stride,
                "interval_95": list(
                    bits_per_byte_interval(score.document_nats, score.document_bytes)
                ),
            }
            for set_name, score in by_set.items()
        },
        "documents": {
            set_name: (score.document_nats, score.document_bytes)
            for set_name, score in by_set.items()
        },
        "added": None if base_set is None else base_set.added,
        "reproduced": reproduce_training_score(model, loaded, batch, scoring.lang, device),
        "tasks": score_tasks(loaded, scoring.tasks, batch, scoring.lang, device),
        "continuations": continuations(loaded, scoring.prompts, device),
    }


def _rows_as_read(rows):
    return rows


def _for_another_process(model: ModelToScore) -> ModelToScore:
    """The model with its training stage's held-out rows read here: what reads them is bound to
    this process's stage run."""
    if model.rows is None:
        return model
    return dataclasses.replace(model, rows=partial(_rows_as_read, model.rows()))


def _score_on(device: str, models: list[ModelToScore], scoring: Scoring, threads: int) -> list:
    """A helper process: its models, one after the other, on its device."""
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    return [score_model(model, scoring, torch.device(device)) for model in models]


def _devices(device: torch.device, workers: int) -> list[str]:
    if device.type == "cuda":
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return ["cpu"] * workers


def score_models(
    models: list[ModelToScore], scoring: Scoring, device: torch.device, workers: int
) -> Scored:
    """Score `models` (the base first), spread over every visible GPU (on a CPU, `workers`
    processes): device i takes models i, i + n, ...; the results in `models`' order."""
    devices = _devices(device, workers)[: len(models)]
    if len(devices) <= 1:
        results = [score_model(model, scoring, device) for model in models]
    else:
        log.info(
            "evaluate %s: %d models on %d %s devices, one process each",
            scoring.lang,
            len(models),
            len(devices),
            device.type.upper(),
        )
        threads = max(1, (os.cpu_count() or 1) // len(devices))
        shares = [
            [_for_another_process(model) for model in models[index :: len(devices)]]
            for index in range(len(devices))
        ]
        import torch.multiprocessing

        context = torch.multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(devices), mp_context=context) as pool:
            done = list(
                pool.map(
                    _score_on, devices, shares, [scoring] * len(devices), [threads] * len(devices)
                )
            )
        results = [
            done[index % len(devices)][index // len(devices)] for index in range(len(models))
        ]
    scored = Scored()
    for model, result in zip(models, results):
        for key in ("scores", "documents", "tasks", "continuations"):
            getattr(scored, key)[model.name] = result[key]
        for key in ("added", "reproduced"):
            if result[key] is not None:
                getattr(scored, key)[model.name] = result[key]
    return scored


def base_vocab(models: list[ModelToScore]) -> Optional[dict[str, int]]:
    """The base's tokens (the base comes first in `models`), or None without a base."""
    if not models or models[0].name != "base":
        return None
    return load_tokenizer(models[0].folder).get_vocab()
