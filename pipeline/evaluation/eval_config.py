"""The typed `eval` section: which held-out text, in which windows; which downstream tasks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING

from pipeline.errors import ConfigError
from pipeline.languages import LANGUAGES

EVAL_DOCUMENT_STARTS = ("eos", "bos")
# The layouts of eval.tasks' files (docs/stages/evaluate.md, "Downstream tasks"): sib200, topic
# classification (a folder of train/dev/test.tsv: index_id, category, text); multiple choice in
# lm-evaluation-harness' prompts (standard_tasks.py): belebele (JSONL: flores_passage, question,
# mc_answer1..4, correct_answer_num), xnli, xstorycloze, global_mmlu; continuation, belebele's
# fields with the answers continuing the passage (the task built from held-out text); and
# flores200, FLORES-200's `<lang>.devtest` (one sentence per line): a held-out set scored in bits
# per byte (texts.py), not a task.
CONTINUATION, FLORES = "continuation", "flores200"
TASK_LAYOUTS = ("sib200", "belebele", "xnli", "xstorycloze", "global_mmlu", CONTINUATION, FLORES)
TEXT_SET_LAYOUTS = (FLORES,)
# lm-evaluation-harness' xnli_en words: `<premise>, right? Yes|Also|No, <hypothesis>`.
DEFAULT_XNLI_WORDS = ("right", "Yes", "Also", "No")
TASK_PATHS = {
    "sib200": "a folder with train.tsv, dev.tsv and test.tsv",
    FLORES: "a FLORES-200 file of one language, one sentence per line (.../devtest/nob_Latn.devtest)",
}


@dataclass
class TaskConfig:
    """A downstream task from local files (pipeline/evaluation/task_files.py), or a FLORES-200
    held-out set (texts.py)."""

    layout: str = MISSING
    # sib200: the folder holding train.tsv, dev.tsv and test.tsv (or .parquet); the other layouts:
    # the file (TSV, CSV, JSONL or Parquet) of one language.
    path: str = MISSING
    # ISO 639-3 code of the task's text (nob; eng to see whether the base's language is kept).
    language: str = MISSING
    # Its name in the report; null: the folder's or file's name.
    name: Optional[str] = None
    # sib200: training examples shown before each test text in the prompting scoring.
    k: int = 5
    # xnli: the prompt's words in the task's language, [question word, entailment, neutral,
    # contradiction] (lm-evaluation-harness' xnli/utils.py lists them for XNLI's 15 languages);
    # null: English's.
    xnli_words: Optional[list[str]] = None


def downstream_tasks(tasks: list[TaskConfig]) -> list[TaskConfig]:
    """The entries of eval.tasks that are tasks to score, not held-out sets (flores200)."""
    return [task for task in tasks if task.layout not in TEXT_SET_LAYOUTS]


@dataclass
class EvalConfig:
    # Held-out text: null takes the clean stage's held-out split; or a file or folder of
    # JSONL/Parquet (the clean reader's formats) or of plain text, one document per line (FLORES'
    # `nob_Latn.devtest`).
    path: Optional[str] = None
    # Held-out text of the base model's language (model.base_lang), to see whether the model forgets
    # it: null takes what `${work_dir}/<model.base_lang>/clean` held out when that clean stage is
    # done (its held-out sources, else its held-out split); or a file or folder as for `path`.
    base_lang_path: Optional[str] = None
    # Tokens per window; null: the model's context, at most 2048, as training takes it
    # (model/model_config.py).
    seq_len: Optional[int] = None
    # Tokens scored per window after the first; the rest of the window is context. Null: half the
    # window.
    stride: Optional[int] = None
    # The token fed before each document's first token: `eos`, as the pack stage separates documents
    # (and BLOOM was trained), or `bos` for models trained with one (Llama 3).
    document_start: str = "eos"
    # Cap on the UTF-8 bytes evaluated per held-out set (whole documents, in order).
    max_bytes: int = 10_000_000
    # Windows (and task sequences) per forward pass.
    batch_size: int = 8
    # Downstream tasks scored for every model: [{layout: sib200, path: /data/sib200/nob_Latn,
    # language: nob}, ...].
    tasks: list[TaskConfig] = field(default_factory=list)
    # Two tasks built from the clean stage's held-out split when it is there
    # (pipeline/evaluation/task_builder.py): which source a paragraph comes from (sib200 layout) and
    # which of four continuations of a passage is its own (belebele layout).
    heldout_tasks: bool = True


def validate_eval(evaluation: EvalConfig) -> None:
    if evaluation.path is not None and not os.path.exists(evaluation.path):
        raise ConfigError(
            "eval.path",
            evaluation.path,
            [
                "null (the clean stage's held-out split)",
                "an existing file or folder of held-out text",
            ],
        )
    if evaluation.base_lang_path is not None and not os.path.exists(evaluation.base_lang_path):
        raise ConfigError(
            "eval.base_lang_path",
            evaluation.base_lang_path,
            [
                "null (the held-out split of <work_dir>/<model.base_lang>/clean, when that clean "
                "stage is done)",
                "an existing file or folder of held-out text in the base model's language",
            ],
        )
    for key in ("seq_len", "stride"):
        value = getattr(evaluation, key)
        if value is not None and value < 1:
            raise ConfigError(f"eval.{key}", value, ["null", "an integer >= 1"])
    if (
        evaluation.seq_len is not None
        and evaluation.stride is not None
        and evaluation.stride > evaluation.seq_len
    ):
        raise ConfigError(
            "eval.stride", evaluation.stride, [f"at most eval.seq_len ({evaluation.seq_len})"]
        )
    if evaluation.document_start not in EVAL_DOCUMENT_STARTS:
        raise ConfigError("eval.document_start", evaluation.document_start, EVAL_DOCUMENT_STARTS)
    for key in ("max_bytes", "batch_size"):
        if getattr(evaluation, key) < 1:
            raise ConfigError(f"eval.{key}", getattr(evaluation, key), ["an integer >= 1"])
    names = []
    for index, task in enumerate(evaluation.tasks):
        key = f"eval.tasks.{index}"
        if task.layout not in TASK_LAYOUTS:
            raise ConfigError(f"{key}.layout", task.layout, TASK_LAYOUTS)
        if not os.path.exists(task.path):
            raise ConfigError(
                f"{key}.path",
                task.path,
                [TASK_PATHS.get(task.layout, "a TSV, CSV, JSONL or Parquet file of one language")],
            )
        _validate_xnli_words(task, key)
        if task.language not in LANGUAGES:
            raise ConfigError(
                f"{key}.language",
                task.language,
                ["an ISO 639-3 code of pipeline/conf/languages.yaml"],
            )
        if task.k < 0:
            raise ConfigError(f"{key}.k", task.k, ["an integer >= 0"])
        names.append(task_name(task))
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(
            "eval.tasks", f"two tasks named {repeated[0]}", ["a distinct `name` for each task"]
        )


def task_name(task: TaskConfig) -> str:
    """The task's name in the report: `name`, else its folder's or file's name without the
    extension."""
    return task.name or os.path.basename(os.path.normpath(task.path)).split(".")[0]


def _validate_xnli_words(task: TaskConfig, key: str) -> None:
    words = task.xnli_words
    if words is None:
        return
    if task.layout != "xnli":
        raise ConfigError(f"{key}.xnli_words", list(words), ["null (it is for layout xnli only)"])
    if len(words) != len(DEFAULT_XNLI_WORDS) or not all(str(word).strip() for word in words):
        raise ConfigError(
            f"{key}.xnli_words",
            list(words),
            [
                "null (English: right, Yes, Also, No)",
                "four words in the task's language: [question word, entailment, neutral, "
                "contradiction]",
            ],
        )
