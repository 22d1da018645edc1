"""Multiple-choice tasks from local files, each item put as lm-evaluation-harness puts it: the prompt
(its `doc_to_text`), the choices (`doc_to_choice`), each scored after the prompt and a space (its
default `target_delimiter`), and the right one (`doc_to_target`). The formats follow the harness'
task YAMLs (lm_eval/tasks/<task>/), zero-shot as `lm_eval` runs them without `--num_fewshot`:

- `belebele` (belebele/_default_template_yaml): `P: <passage>\\nQ: <question>\\nA: <answer 1>\\nB: ...
  \\nD: <answer 4>\\nAnswer:`, choices `A`-`D`; JSON Lines of `flores_passage`, `question`,
  `mc_answer1`..`mc_answer4`, `correct_answer_num` (1-4).
- `xnli` (xnli/xnli_<lang>.yaml): no prompt; each choice is a whole text `<premise>, right? Yes,
  <hypothesis>` (entailment), `... Also, ...` (neutral), `... No, ...` (contradiction), in the
  task's words (`xnli_words`); XNLI 1.0's TSV/JSONL (`sentence1`, `sentence2`, `gold_label`, all
  languages in one file: the rows whose `language` is the task's are read) or Hugging Face's
  (`premise`, `hypothesis`, `label` 0-2).
- `xstorycloze` (xstorycloze/default_<lang>.yaml): the four sentences joined by spaces, the two
  endings as choices; XStoryCloze's TSV (`InputSentence1`..`4`, `RandomFifthSentenceQuiz1`/`2`,
  `AnswerRightEnding` 1-2) or Hugging Face's snake_case columns.
- `global_mmlu` (global_mmlu/full/<lang>/_<lang>_template_yaml): `<question>\\nA. <option a>\\nB.
  ...\\nD. <option d>\\nAnswer:`, choices `A`-`D`; Global-MMLU's `question`, `option_a`..`option_d`,
  `answer` (a letter).
- `continuation` (ours, the task built from held-out text): belebele's fields, each answer scored
  as the passage's continuation (after the question on a new line when there is one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.errors import StageError
from pipeline.evaluation.eval_config import CONTINUATION, DEFAULT_XNLI_WORDS, TaskConfig, task_name
from pipeline.evaluation.task_records import (
    Place,
    field_choice,
    field_text,
    pick_columns,
    read_records,
    require_columns,
)
from pipeline.languages import LANGUAGES

# lm-evaluation-harness' defaults (lm_eval/config/task.py): between a prompt and each choice, and
# after each example shown before the question.
TARGET_DELIMITER, FEWSHOT_DELIMITER = " ", "\n\n"
LETTERS = ("A", "B", "C", "D")
BELEBELE_ANSWERS = ("mc_answer1", "mc_answer2", "mc_answer3", "mc_answer4")
BELEBELE_COLUMNS = ("flores_passage", "question", *BELEBELE_ANSWERS, "correct_answer_num")
# XNLI 1.0 as published (dl.fbaipublicfiles.com/XNLI/XNLI-1.0.zip), then Hugging Face's facebook/xnli.
XNLI_COLUMNS = (("sentence1", "sentence2", "gold_label"), ("premise", "hypothesis", "label"))
XNLI_LABELS = ("entailment", "neutral", "contradiction")
# XStoryCloze as published (StoryCloze's column names), then Hugging Face's juletxara/xstory_cloze.
STORY_COLUMNS = (
    (
        *(f"InputSentence{number}" for number in range(1, 5)),
        "RandomFifthSentenceQuiz1",
        "RandomFifthSentenceQuiz2",
        "AnswerRightEnding",
    ),
    (
        *(f"input_sentence_{number}" for number in range(1, 5)),
        "sentence_quiz1",
        "sentence_quiz2",
        "answer_right_ending",
    ),
)
MMLU_OPTIONS = ("option_a", "option_b", "option_c", "option_d")
MMLU_COLUMNS = ("question", *MMLU_OPTIONS, "answer")
# Layouts whose TSVs are written without quoting (their sentences open with quotation marks).
UNQUOTED_LAYOUTS = ("xnli", "xstorycloze")
EXAMPLE_FILES = {
    "belebele": "nob_Latn.jsonl",
    CONTINUATION: "continuation.jsonl",
    "xnli": "XNLI-1.0/xnli.test.tsv",
    "xstorycloze": "spring2016.val.sw.tsv.split_20_80_eval.tsv",
    "global_mmlu": "sw/test-00000-of-00001.parquet",
}


@dataclass(frozen=True)
class Question:
    """One item as lm-evaluation-harness scores it: the prompt (empty where each choice is a whole
    text, as in XNLI), the choices, each scored after the prompt and a space, and the right one's
    index."""

    context: str
    choices: tuple[str, ...]
    correct: int


@dataclass(frozen=True)
class MultipleChoice:
    """A multiple-choice task: its items in the file's order."""

    name: str
    language: str
    path: str
    questions: tuple[Question, ...]
    layout: str = "belebele"


Items = Callable[[TaskConfig, Path, list[dict], list[str], Place], list[Question]]


def _belebele_items(
    task: TaskConfig, file: Path, records: list[dict], columns: list[str], place: Place
) -> list[Question]:
    """belebele's prompt with the letters as choices, or (`continuation`) the answers continuing the
    passage."""
    require_columns(file, columns, BELEBELE_COLUMNS)
    items = []
    for index, record in enumerate(records):
        where = place(index)
        passage = field_text(file, where, record, "flores_passage")
        question = field_text(file, where, record, "question", empty_ok=task.layout == CONTINUATION)
        answers = [field_text(file, where, record, column) for column in BELEBELE_ANSWERS]
        correct = field_choice(file, where, record, "correct_answer_num", ("1", "2", "3", "4"))
        if task.layout == CONTINUATION:
            context = "\n".join(part.strip() for part in (passage, question) if part.strip())
            items.append(Question(context, tuple(answer.strip() for answer in answers), correct))
            continue
        options = "".join(f"\n{letter}: {answer}" for letter, answer in zip(LETTERS, answers))
        context = f"P: {passage}\nQ: {question.strip()}{options}\nAnswer:"
        items.append(Question(context, LETTERS, correct))
    return items


def _language_codes(code: str) -> set[str]:
    """How a file that holds several languages may name the task's: ISO 639-1 (XNLI's `de`) or 639-3."""
    return {code, LANGUAGES[code].get("iso639_1") or code}


def _xnli_items(
    task: TaskConfig, file: Path, records: list[dict], columns: list[str], place: Place
) -> list[Question]:
    premise_field, hypothesis_field, label_field = pick_columns(file, columns, XNLI_COLUMNS)
    question, *answers = task.xnli_words or DEFAULT_XNLI_WORDS
    codes = _language_codes(task.language)
    items = []
    for index, record in enumerate(records):
        if "language" in record and str(record["language"]).strip() not in codes:
            continue  # XNLI 1.0's files hold all 15 languages, one row each
        where = place(index)
        premise = field_text(file, where, record, premise_field)
        hypothesis = field_text(file, where, record, hypothesis_field)
        label = field_choice(file, where, record, label_field, ("0", "1", "2", *XNLI_LABELS))
        choices = tuple(f"{premise}, {question}? {answer}, {hypothesis}" for answer in answers)
        items.append(Question("", choices, label % len(XNLI_LABELS)))
    if not items:
        found = sorted({str(record.get("language")) for record in records})
        raise StageError(
            f"Task file {file} holds no row of language {task.language} (column `language`: "
            f"{' or '.join(sorted(codes))}; found: {', '.join(found)}). Give the task the language "
            "of the rows to score, or point it at another file."
        )
    return items


def _story_items(
    task: TaskConfig, file: Path, records: list[dict], columns: list[str], place: Place
) -> list[Question]:
    *sentences, first, second, answer = pick_columns(file, columns, STORY_COLUMNS)
    items = []
    for index, record in enumerate(records):
        where = place(index)
        story = " ".join(field_text(file, where, record, field) for field in sentences)
        endings = (field_text(file, where, record, first), field_text(file, where, record, second))
        items.append(
            Question(story, endings, field_choice(file, where, record, answer, ("1", "2")))
        )
    return items


def _mmlu_items(
    task: TaskConfig, file: Path, records: list[dict], columns: list[str], place: Place
) -> list[Question]:
    require_columns(file, columns, MMLU_COLUMNS)
    items = []
    for index, record in enumerate(records):
        where = place(index)
        question = field_text(file, where, record, "question")
        options = [field_text(file, where, record, column) for column in MMLU_OPTIONS]
        listed = "".join(f"\n{letter}. {option}" for letter, option in zip(LETTERS, options))
        correct = field_choice(file, where, record, "answer", LETTERS)
        items.append(Question(f"{question.strip()}{listed}\nAnswer:", LETTERS, correct))
    return items


ITEMS: dict[str, Items] = {
    "belebele": _belebele_items,
    CONTINUATION: _belebele_items,
    "xnli": _xnli_items,
    "xstorycloze": _story_items,
    "global_mmlu": _mmlu_items,
}


def read_multiple_choice(task: TaskConfig, scratch: Path) -> MultipleChoice:
    """The task's items in its layout's prompt format, checked: a StageError names the file, the
    line (Parquet: the row) and the field of the first problem."""
    file = Path(task.path)
    if file.is_dir():
        raise StageError(
            f"The {task.layout} task path {file} is a folder: give the file of one language, e.g. "
            f".../{EXAMPLE_FILES[task.layout]}."
        )
    records, columns, place = read_records(file, scratch, unquoted=task.layout in UNQUOTED_LAYOUTS)
    questions = ITEMS[task.layout](task, file, records, columns, place)
    return MultipleChoice(task_name(task), task.language, str(file), tuple(questions), task.layout)
