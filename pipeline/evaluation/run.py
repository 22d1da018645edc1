"""What the evaluate stage does: every model scored on every held-out set (texts.py) and downstream
task, flagged where a trained model is worse than the base, the final model compared with the base
with the uncertainty of each change (uncertainty.py), the cost of the training read from its
stages' markers, greedy continuations of held-out prompts (generation.py), and all of it reported
(report.py: report.json, report.md and the plots).

The tasks (`eval.tasks`, and those built from the held-out split with `eval.heldout_tasks`:
task_builder.py) are read and checked before any model loads; the models are scored spread over the
visible GPUs, one model in memory at a time on each (model_scores.py).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Optional

import torch

from pipeline.corpus.reader import fingerprint_files
from pipeline.errors import StageError
from pipeline.evaluation.eval_config import downstream_tasks, task_name
from pipeline.evaluation.lm_eval_results import models_in_report, write_lm_eval_results
from pipeline.evaluation.generation import NEW_TOKENS, PROMPT_WORDS, held_out_prompts
from pipeline.evaluation.model_scores import Scored, Scoring, base_vocab, score_models
from pipeline.evaluation.models import ModelToScore
from pipeline.evaluation.report import (
    REPORT_FILE,
    REPORT_TEXT_FILE,
    added_tokens_line,
    find_regressions,
    markdown,
    regression_line,
    write_plots,
)
from pipeline.evaluation.summary import training_cost
from pipeline.evaluation.task_builder import build_heldout_tasks
from pipeline.evaluation.task_files import Task, read_task
from pipeline.evaluation.texts import (
    HELDOUT,
    TextSet,
    base_lang_sets,
    heldout_set,
    is_base_lang,
    text_files,
    text_sets,
)
from pipeline.evaluation.uncertainty import accuracy_change, bits_per_byte_change
from pipeline.json_files import write_json_atomic
from pipeline.kernels import set_backend
from pipeline.model.model_config import ModelConfig, parameter_count
from pipeline.model.files import base_identity

log = logging.getLogger(__name__)

# stage=workflow scores models of this size or more on a GPU (a real base: SmolLM2-135M took 2.2
# minutes on one H100); the demo's small model on a CPU.
GPU_SCORING_PARAMETERS = 50_000_000
# In the stage's folder: the tasks built from the held-out text, and what the readers unpack while
# they read.
BUILT_TASKS, SCRATCH = "tasks", "scratch"


def scores_on_gpu(model: ModelConfig) -> bool:
    """Whether models of this shape (the base's, which the trained ones keep) are large enough to
    need a GPU."""
    return parameter_count(model) >= GPU_SCORING_PARAMETERS


def eval_inputs(cfg, base: Optional[str]) -> dict:
    """What the evaluation reads besides the earlier stages' outputs, by content: the base model
    `base`, `eval.path`'s files, the text of the base model's language and the tasks' files (`cfg`:
    the pipeline config, for its `eval` section and the text sets, texts.py)."""
    inputs = {}
    if base is not None:
        inputs["base"] = base_identity(cfg, base)
    if cfg.eval.path is not None:
        inputs["text"] = heldout_set(cfg.eval.path, cfg.lang.code, None).identity()
    base_lang = base_lang_sets(cfg)
    if not isinstance(base_lang, str):
        inputs["base_lang_text"] = {text_set.name: text_set.identity() for text_set in base_lang}
    if cfg.eval.tasks:
        inputs["tasks"] = {
            task_name(task): fingerprint_files(*text_files(Path(task.path))[:2])
            for task in cfg.eval.tasks
        }
    return inputs


def _read_sets(
    cfg, clean: Optional[Path], scratch: Path
) -> tuple[dict[str, TextSet], dict[str, list[tuple[str, dict]]], dict[str, str]]:
    """The held-out sets with text, their documents as (text, metadata), up to eval.max_bytes each,
    and why the others are skipped."""
    lang = cfg.lang.code
    found, skipped = text_sets(cfg, clean)
    sets, records = {}, {}
    for text_set in found:
        documents = [
            record for record in text_set.records(scratch, cfg.eval.max_bytes) if record[0]
        ]
        if documents:
            sets[text_set.name], records[text_set.name] = text_set, documents
        elif text_set.name == HELDOUT:
            raise StageError(
                f"evaluate {lang}: {text_set.where} holds no text. Give eval.path=<file or "
                "folder>, "
                f"or raise clean.heldout_min_documents and run clean again."
            )
        else:
            skipped[text_set.name] = f"{text_set.where} holds no text"
    for name, reason in skipped.items():
        log.info("evaluate %s: the `%s` set is not scored: %s.", lang, name, reason)
    return sets, records, skipped


def _read_tasks(
    cfg, heldout: list[tuple[str, dict]], folder: Path
) -> tuple[list[Task], dict[str, str]]:
    """eval.tasks and the tasks built from the `heldout` set's documents (eval.heldout_tasks), read
    and checked: a bad file fails here, before any model loads. Also why a built task is missing."""
    lang = cfg.lang.code
    configured, skipped = downstream_tasks(cfg.eval.tasks), {}
    if cfg.eval.heldout_tasks:
        built, skipped = build_heldout_tasks(heldout, lang, folder / BUILT_TASKS)
        for task in built:
            if any(task_name(other) == task.name for other in cfg.eval.tasks):
                raise StageError(
                    f"evaluate {lang}: eval.tasks names a task `{task.name}`, like the task built "
                    "from the held-out text; give it another name, or set "
                    "eval.heldout_tasks=false."
                )
        configured += built
    for name, reason in skipped.items():
        log.info(
            "evaluate %s: the `%s` task is not built from the held-out text: %s.",
            lang,
            name,
            reason,
        )
    return [read_task(task, folder / SCRATCH / "datasets") for task in configured], skipped


def _describe_task(task: Task, folder: Path, final_dir: Path) -> dict:
    path = Path(task.path)
    if path.is_relative_to(folder):  # a task built here: where it will be once the stage is done
        path = final_dir / path.relative_to(folder)
    about = {"layout": task.layout, "language": task.language, "path": str(path)}
    if task.layout == "sib200":
        counts = [sum(example.label == label for example in task.test) for label in task.labels]
        return {
            **about,
            "labels": list(task.labels),
            "train": len(task.train),
            "dev": len(task.dev),
            "test": len(task.test),
            "k": task.k,
            "majority": max(counts) / len(task.test),
        }
    return {**about, "test": len(task.questions)}


def final_model(names) -> Optional[str]:
    """The model the recipe ends with: pretrain where it ran, else warmup; None without either."""
    return next((name for name in ("pretrain", "warmup") if name in names), None)


def headline(scored: Scored, titles: dict[str, str]) -> list[dict]:
    """The base against the final model: each set's bits per byte and each task's accuracy per
    scoring, with the paired bootstrap interval of the change and its verdict (uncertainty.py);
    empty without a base and a trained model."""
    final = final_model(scored.scores)
    if final is None or "base" not in scored.scores:
        return []
    rows = []
    for name, title in titles.items():
        base_nats, base_bytes = scored.documents["base"][name]
        change = bits_per_byte_change(base_nats, base_bytes, *scored.documents[final][name])
        about = {"measure": "bits per byte", "set": name, "title": title, "model": final}
        rows.append({**about, "n": scored.scores[final][name]["documents"], **change.as_dict()})
    for task, by_scoring in scored.tasks["base"].items():
        for scoring, accuracy in by_scoring.items():
            change = accuracy_change(accuracy.outcomes, scored.tasks[final][task][scoring].outcomes)
            about = {"measure": "accuracy", "task": task, "scoring": scoring, "model": final}
            rows.append({**about, "n": accuracy.n, **change.as_dict()})
    return rows


def _continuations_report(prompts: list[str], by_model: dict[str, list[str]]) -> dict:
    """How the prompts were made and continued, and each prompt with every model's continuation."""
    return {
        "words": PROMPT_WORDS,
        "new_tokens": NEW_TOKENS,
        "prompts": [
            {"prompt": prompt, "models": {model: texts[index] for model, texts in by_model.items()}}
            for index, prompt in enumerate(prompts)
        ],
    }


def _log_regressions(
    lang: str,
    regressions: list[dict],
    sets: dict[str, TextSet],
    base_set: Optional[str],
    added: dict,
    has_base: bool,
) -> None:
    """Warn of each regression, and of what the added tokens take when the base's language
    regressed (they may be why); say so when there is no base to compare with."""
    for regression in regressions:
        log.warning(
            "evaluate %s: %s", lang, regression_line(regression, sets[regression["set"]].title)
        )
    if added and any(is_base_lang(regression["set"]) for regression in regressions):
        log.warning("evaluate %s: %s", lang, added_tokens_line(added, sets[base_set].title))
    if not has_base:
        log.info(
            "evaluate %s: no base model to compare with (model.base), so no regression is checked.",
            lang,
        )


def _describe_sets(sets: dict[str, TextSet], texts: dict[str, list[str]]) -> dict:
    """The report's entry for each scored set: its title, where its text is and how much was read."""
    return {
        name: {
            "title": text_set.title,
            "text": text_set.where,
            "documents": len(texts[name]),
            "bytes": sum(len(text.encode("utf-8")) for text in texts[name]),
        }
        for name, text_set in sets.items()
    }


def _marker_metrics(report: dict, bpb: dict) -> dict:
    """The stage marker's metrics: bits per byte and their 95% intervals, regressions, the training
    held-out scores (without their details) and each task's accuracy by model and scoring."""
    return {
        "bits_per_byte": bpb,
        "bits_per_byte_interval_95": {
            model: {name: score["interval_95"] for name, score in by_set.items()}
            for model, by_set in report["scores"].items()
        },
        "regressions": report["regressions"],
        "training_heldout": {
            name: {key: again[key] for key in ("logged", "rescored", "agree")}
            for name, again in report["training_heldout"].items()
        },
        "tasks": {
            task: {
                model: {scoring: result["accuracy"] for scoring, result in by_model.items()}
                for model, by_model in about["results"].items()
            }
            for task, about in report["tasks"].items()
        },
    }


def _task_report(tasks: list[Task], scored: Scored, folder: Path, final_dir: Path) -> dict:
    """Each task: what it is, and every model's accuracies by scoring."""
    return {
        task.name: {
            **_describe_task(task, folder, final_dir),
            "results": {
                model: {
                    scoring: accuracy.as_dict() for scoring, accuracy in by_task[task.name].items()
                }
                for model, by_task in scored.tasks.items()
            },
        }
        for task in tasks
    }


def evaluate_models(
    folder: Path, final_dir: Path, models: list[ModelToScore], cfg, clean: Optional[Path]
) -> dict:
    """Score `models` (in the recipe's order, the base first) on the held-out sets (of the clean
    output `clean`, or `eval.path`) and the tasks; write the report to `folder` (where it will be:
    `final_dir`) and return the marker's metrics. `cfg`: the pipeline config, for its `eval`
    section, its kernels and the text sets (texts.py)."""
    lang = cfg.lang.code
    set_backend(cfg.kernels)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = {model.name: model.folder for model in models}
    sets, records, skipped = _read_sets(cfg, clean, folder / SCRATCH)
    tasks, skipped_tasks = _read_tasks(cfg, records[HELDOUT], folder)
    texts = {name: [text for text, _ in documents] for name, documents in records.items()}
    # What the added tokens take is measured on the first set of the base's language (the unread
    # book for English).
    base_set = next((name for name in sets if is_base_lang(name)), None)
    scoring = Scoring(
        sets,
        texts,
        tasks,
        base_set,
        base_vocab(models),
        held_out_prompts(texts[HELDOUT]),
        cfg.eval,
        lang,
    )
    scored = score_models(models, scoring, device, cfg.workers)
    shutil.rmtree(folder / SCRATCH, ignore_errors=True)
    bpb = {
        name: {set_name: score["bits_per_byte"] for set_name, score in by_set.items()}
        for name, by_set in scored.scores.items()
    }
    regressions = find_regressions(bpb)
    _log_regressions(lang, regressions, sets, base_set, scored.added, "base" in found)
    curves = {model.name: model.curves for model in models if model.curves is not None}
    titles = {name: text_set.title for name, text_set in sets.items()}
    plots = write_plots(folder, bpb, titles, curves)
    report = {
        "lang": lang,
        "models": found,
        "headline": headline(scored, titles),
        "cost": {
            model.name: training_cost(model.training, model.curves)
            for model in models
            if model.training is not None
        },
        "continuations": _continuations_report(scoring.prompts, scored.continuations),
        "sets": _describe_sets(sets, texts),
        "skipped_sets": skipped,
        "scores": scored.scores,
        "regressions": regressions,
        "added_tokens": {"set": base_set, "models": scored.added} if scored.added else {},
        "training_heldout": scored.reproduced,
        "tasks": _task_report(tasks, scored, folder, final_dir),
        "skipped_tasks": skipped_tasks,
    }
    write_json_atomic(folder / REPORT_FILE, report)
    write_lm_eval_results(folder, models_in_report(report))
    (folder / REPORT_TEXT_FILE).write_text(markdown(lang, report, plots), encoding="utf-8")
    log.info("evaluate %s: report in %s", lang, final_dir / REPORT_TEXT_FILE)
    return _marker_metrics(report, bpb)
