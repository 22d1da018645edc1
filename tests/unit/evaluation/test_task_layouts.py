"""The standard layouts of eval.tasks from local files: a few items written in each published layout
are read back in lm-evaluation-harness' prompt formats (the expected strings follow its task YAMLs:
lm_eval/tasks/xnli/xnli_<lang>.yaml, xstorycloze/default_<lang>.yaml,
global_mmlu/full/<lang>/_<lang>_template_yaml), a bad file is named with its line (or row) and
field, and a FLORES-200 file becomes a held-out set."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.errors import ConfigError, StageError
from pipeline.evaluation.eval_config import EvalConfig, TaskConfig, downstream_tasks, validate_eval
from pipeline.evaluation.task_files import read_task
from pipeline.evaluation.texts import text_sets

XNLI_HEADER = ["language", "gold_label", "sentence1", "sentence2", "pairID"]
STORY_HEADER = [
    "InputStoryid",
    *(f"InputSentence{number}" for number in range(1, 5)),
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
]
MMLU_RECORD = {
    "sample_id": "abstract_algebra/test/0",
    "subject": "abstract_algebra",
    "subject_category": "STEM",
    "question": " Hva er 2 + 2? ",
    "option_a": "3",
    "option_b": "4",
    "option_c": "5",
    "option_d": "22",
    "answer": "B",
}


def _tsv(path: Path, header: list[str], rows: list[list]) -> Path:
    # Written as the published files are: tab-separated, nothing quoted.
    lines = ["\t".join(header), *("\t".join(str(value) for value in row) for row in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _read(layout: str, path: Path, tmp_path: Path, language: str = "nob", **options):
    task = TaskConfig(layout=layout, path=str(path), language=language, **options)
    return read_task(task, tmp_path / "scratch")


def _xnli_1_0(path: Path, german_label: str = "contradiction") -> Path:
    return _tsv(
        path,
        XNLI_HEADER,
        [
            ["en", "entailment", '"Hi," he said.', "He spoke.", 1],
            ["de", "neutral", '"Hallo", sagte er.', "Er sprach laut.", 1],
            ["de", german_label, "Es regnet.", "Die Sonne scheint.", 2],
        ],
    )


def test_xnli_1_0_rows_of_the_task_language_in_its_words(tmp_path):
    task = _read(
        "xnli",
        _xnli_1_0(tmp_path / "xnli.test.tsv"),
        tmp_path,
        language="deu",
        xnli_words=["richtig", "Ja", "Auch", "Nein"],
    )
    assert task.name == "xnli" and task.layout == "xnli"
    assert [question.correct for question in task.questions] == [1, 2]
    first = task.questions[0]
    assert first.context == ""  # each choice is a whole text, as the harness' doc_to_text: ''
    assert first.choices == (
        '"Hallo", sagte er., richtig? Ja, Er sprach laut.',
        '"Hallo", sagte er., richtig? Auch, Er sprach laut.',
        '"Hallo", sagte er., richtig? Nein, Er sprach laut.',
    )


def test_xnli_from_hugging_face_columns_in_english_words(tmp_path):
    path = tmp_path / "test-00000-of-00001.parquet"
    pd.DataFrame(
        {"premise": ["It rains.", "I ate."], "hypothesis": ["It is wet.", "I am hungry."]}
        | {"label": [0, 2]}
    ).to_parquet(path)
    task = _read("xnli", path, tmp_path, language="eng")
    assert [question.correct for question in task.questions] == [0, 2]
    assert task.questions[1].choices[2] == "I ate., right? No, I am hungry."


def test_xstorycloze_published_and_hugging_face_columns(tmp_path):
    story = ["Ana gikk ut.", '"Det regner," sa hun.', "Hun fant en paraply.", "Hun gikk videre."]
    published = _tsv(
        tmp_path / "spring2016.val.nb.tsv.split_20_80_eval.tsv",
        STORY_HEADER,
        [["id-1", *story, "Hun ble tørr.", "Hun fløy til månen.", 1]],
    )
    task = _read("xstorycloze", published, tmp_path)
    (question,) = task.questions
    assert question.context == " ".join(story)  # the harness joins the four with spaces
    assert question.choices == ("Hun ble tørr.", "Hun fløy til månen.") and question.correct == 0
    snake = tmp_path / "eval.jsonl"
    record = {f"input_sentence_{number}": text for number, text in enumerate(story, 1)}
    record |= {"sentence_quiz1": "A.", "sentence_quiz2": "B.", "answer_right_ending": 2}
    snake.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert _read("xstorycloze", snake, tmp_path).questions[0].correct == 1


def test_global_mmlu_from_parquet_and_csv(tmp_path):
    parquet = tmp_path / "test-00000-of-00001.parquet"
    pd.DataFrame([MMLU_RECORD, {**MMLU_RECORD, "answer": "D"}]).to_parquet(parquet)
    task = _read("global_mmlu", parquet, tmp_path)
    assert task.questions[0].context == "Hva er 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    assert task.questions[0].choices == ("A", "B", "C", "D")
    assert [question.correct for question in task.questions] == [1, 3]
    spreadsheet = tmp_path / "global_mmlu_nob.csv"
    with open(spreadsheet, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(MMLU_RECORD))
        writer.writeheader()
        writer.writerow({**MMLU_RECORD, "question": "Hvilket tall, av disse?"})
    assert (
        _read("global_mmlu", spreadsheet, tmp_path)
        .questions[0]
        .context.startswith("Hvilket tall, av disse?\nA. 3")
    )


def test_continuation_scores_the_answers_after_the_passage(tmp_path):
    path = tmp_path / "continuation.jsonl"
    record = {"flores_passage": "Det var en gang", "question": "", "correct_answer_num": "3"}
    record |= {f"mc_answer{number}": f"svar {number} " for number in range(1, 5)}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    (question,) = _read("continuation", path, tmp_path).questions
    assert question.context == "Det var en gang" and question.correct == 2
    assert question.choices == ("svar 1", "svar 2", "svar 3", "svar 4")


@pytest.mark.parametrize(
    "case",
    ["xnli label", "xnli language", "story ending", "mmlu answer", "mmlu column", "a folder"],
)
def test_a_bad_file_is_named_with_its_place_and_field(tmp_path, case):
    if case == "xnli label":
        path, layout, language = _xnli_1_0(tmp_path / "x.tsv", "maybe"), "xnli", "deu"
        expected = [str(path), "line 4", "`gold_label`", "'maybe' is not 0, 1, 2, entailment"]
    elif case == "xnli language":
        path, layout, language = _xnli_1_0(tmp_path / "x.tsv"), "xnli", "swa"
        expected = [str(path), "holds no row of language swa", "sw", "found: de, en"]
    elif case == "story ending":
        path = _tsv(tmp_path / "s.tsv", STORY_HEADER, [["id", "a", "b", "c", "d", "e", "f", 3]])
        layout, language = "xstorycloze", "nob"
        expected = [str(path), "line 2", "`AnswerRightEnding`", "3 is not 1 or 2"]
    elif case == "mmlu answer":
        path = tmp_path / "m.parquet"
        pd.DataFrame([MMLU_RECORD, {**MMLU_RECORD, "answer": "E"}]).to_parquet(path)
        layout, language = "global_mmlu", "nob"
        expected = [str(path), "row 2", "`answer`", "'E' is not A, B, C or D"]
    elif case == "mmlu column":
        path = tmp_path / "m.parquet"
        pd.DataFrame([{k: v for k, v in MMLU_RECORD.items() if k != "option_c"}]).to_parquet(path)
        layout, language = "global_mmlu", "nob"
        expected = [str(path), "every record", "`option_c`", "the column is missing"]
    else:
        path, layout, language = tmp_path, "xstorycloze", "nob"
        expected = [f"The xstorycloze task path {tmp_path} is a folder", "split_20_80_eval.tsv"]
    with pytest.raises(StageError) as error:
        _read(layout, path, tmp_path, language=language)
    for part in expected:
        assert part in str(error.value), (part, str(error.value))


def _config(tmp_path: Path, tasks: list[TaskConfig]) -> SimpleNamespace:
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Held-out text.\n", encoding="utf-8")
    evaluation = EvalConfig(path=str(heldout), base_lang_path=str(heldout), tasks=tasks)
    validate_eval(evaluation)
    return SimpleNamespace(
        eval=evaluation, lang=SimpleNamespace(code="nob"), model=SimpleNamespace(base_lang="eng")
    )


def test_a_flores200_file_is_a_held_out_set(tmp_path):
    devtest = tmp_path / "nob_Latn.devtest"
    devtest.write_text("Første setning.\nAndre setning.\n", encoding="utf-8")
    flores = TaskConfig(layout="flores200", path=str(devtest), language="nob")
    belebele = TaskConfig(layout="belebele", path=str(devtest), language="nob", name="b")
    sets, _ = text_sets(_config(tmp_path, [flores, belebele]), clean=None)
    assert [text_set.name for text_set in sets] == ["heldout", "base_lang", "flores200:nob_Latn"]
    documents = sets[-1].records(tmp_path / "scratch", max_bytes=10_000)
    assert [text for text, _ in documents] == ["Første setning.", "Andre setning."]
    assert downstream_tasks([flores, belebele]) == [belebele]


@pytest.mark.parametrize("case", ["not UTF-8", "empty"])
def test_a_bad_flores200_file_is_named(tmp_path, case):
    devtest = tmp_path / "nob_Latn.devtest"
    devtest.write_bytes(b"Setning.\n\xff\xfe broken\n" if case == "not UTF-8" else b"\n\n")
    config = _config(tmp_path, [TaskConfig(layout="flores200", path=str(devtest), language="nob")])
    with pytest.raises(StageError) as error:
        text_sets(config, clean=None)
    expected = "line 2: not UTF-8" if case == "not UTF-8" else "holds no sentence"
    assert str(devtest) in str(error.value) and expected in str(error.value)


def test_xnli_words_are_checked(tmp_path):
    path = str(_xnli_1_0(tmp_path / "x.tsv"))
    two_words = TaskConfig(layout="xnli", path=path, language="deu", xnli_words=["ja", "nei"])
    with pytest.raises(ConfigError, match="xnli_words"):
        _config(tmp_path, [two_words])
    not_xnli = TaskConfig(layout="belebele", path=path, language="nob", xnli_words=["a"] * 4)
    with pytest.raises(ConfigError, match="layout xnli only"):
        _config(tmp_path, [not_xnli])
