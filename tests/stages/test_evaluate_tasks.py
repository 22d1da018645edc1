"""Downstream tasks in stage `evaluate`: the sib200 and belebele layouts read and checked (bad files
named by file, line and field before any model loads), the log-likelihoods against transformers,
the intervals, and the tasks built from held-out text, on which the trained English base beats
chance and a random model. The other layouts: tests/unit/evaluation/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import StageError
from pipeline.evaluation.eval_config import TaskConfig
from pipeline.evaluation.task_builder import source_label
from pipeline.evaluation.task_files import read_task
from pipeline.evaluation.task_scoring import (
    ScoringModel,
    continuation_log_likelihoods,
    fit_probe,
    prompt,
    shots,
    wilson_interval,
)
from pipeline.model.files import load_base
from pipeline.tokenization.folder import load_tokenizer, token_roles
from tests.conftest import DATA, marker, read_jsonl_gz, run_cli, write_jsonl_gz
from tests.stages.test_evaluate import _clean_output, _trained_output, _variant


def test_wilson_interval_matches_the_published_values():
    # Wilson (1927) as tabulated by Newcombe (1998), Statistics in Medicine 17, table I: 95%
    # intervals.
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=1e-4)


def test_probe_learns_what_the_features_hold_and_nothing_more():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(300) % 3
    centres = torch.randn((3, 16), generator=generator) * 2
    features = centres[labels] + torch.randn((300, 16), generator=generator)
    predict = fit_probe(features[:200], labels[:200], 3)
    assert (predict(features[200:]) == labels[200:]).float().mean() > 0.9
    noise = torch.randn((300, 16), generator=generator)  # features that say nothing of the labels
    predict = fit_probe(noise[:200], labels[:200], 3)
    assert (predict(noise[200:]) == labels[200:]).float().mean() < 0.55


def _write_tsv(path: Path, rows: list[tuple], header=("index_id", "category", "text")) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _sib(folder: Path, test_label: str = "sport") -> Path:
    _write_tsv(
        folder / "train.tsv",
        [(0, "sport", "Laget vant kampen."), (1, "politikk", "Stortinget vedtok loven.")],
    )
    _write_tsv(folder / "dev.tsv", [(2, "sport", "Hun løp fort.")])
    _write_tsv(
        folder / "test.tsv",
        [(3, "politikk", "Regjeringen gikk av."), (4, test_label, "Målvakten reddet.")],
    )
    return folder


def _belebele_record(**changes) -> dict:
    record = {
        "flores_passage": "Oslo er hovedstaden i Norge.",
        "question": "Hva er hovedstaden?",
        "mc_answer1": "Bergen",
        "mc_answer2": "Oslo",
        "mc_answer3": "Tromsø",
        "mc_answer4": "Stavanger",
        "correct_answer_num": 2,
    }
    return {**record, **changes}


def _jsonl(path: Path, records: list[dict], blank_line_after: int = -1) -> Path:
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    if blank_line_after >= 0:
        lines.insert(blank_line_after + 1, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _read(layout: str, path: Path, tmp_path: Path):
    return read_task(
        TaskConfig(layout=layout, path=str(path), language="nob", k=1), tmp_path / "scratch"
    )


def test_both_layouts_are_read_with_datasets(tmp_path):
    sib = _read("sib200", _sib(tmp_path / "sib"), tmp_path)
    assert (
        sib.name == "sib"
        and sib.labels == ("politikk", "sport")
        and len(sib.train) == 2
        and len(sib.test) == 2
    )
    assert sib.test[1].text == "Målvakten reddet." and sib.test[1].label == "sport"
    assert (
        prompt(sib, 0)
        == f"{shots(sib, 0)[0].text}\nCategory: {shots(sib, 0)[0].label}\n\nRegjeringen gikk av."
        "\nCategory:"
    )
    belebele = _read(
        "belebele",
        _jsonl(
            tmp_path / "nob_Latn.jsonl",
            [_belebele_record(), _belebele_record(correct_answer_num="4")],
        ),
        tmp_path,
    )
    assert belebele.name == "nob_Latn" and [q.correct for q in belebele.questions] == [1, 3]
    # lm-evaluation-harness' belebele prompt: the answers listed, the letters as choices.
    assert belebele.questions[0].context == (
        "P: Oslo er hovedstaden i Norge.\nQ: Hva er hovedstaden?\nA: Bergen\nB: Oslo\n"
        "C: Tromsø\nD: Stavanger\nAnswer:"
    )
    assert belebele.questions[0].choices == ("A", "B", "C", "D")


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "missing column",
        "label outside the set",
        "empty split",
        "answer number 5",
        "answer number text",
        "empty answer",
        "not a folder",
        "malformed line",
    ],
)
def test_a_bad_task_file_is_named_with_its_line_and_field(tmp_path, case):
    records = [_belebele_record(), _belebele_record(), _belebele_record()]
    if case == "missing file":
        folder = _sib(tmp_path / "sib")
        (folder / "dev.tsv").unlink()
        expected = [str(folder), "dev.tsv"]
        layout, path = "sib200", folder
    elif case == "missing column":
        folder = _sib(tmp_path / "sib")
        _write_tsv(
            folder / "test.tsv", [(3, "sport", "Tekst.")], header=("index_id", "label", "text")
        )
        expected = [str(folder / "test.tsv"), "the header", "`category`", "the column is missing"]
        layout, path = "sib200", folder
    elif case == "label outside the set":
        expected = [
            str(tmp_path / "sib" / "test.tsv"),
            "line 3",
            "`category`",
            "'kultur' is not a category",
        ]
        layout, path = "sib200", _sib(tmp_path / "sib", test_label="kultur")
    elif case == "empty split":
        folder = _sib(tmp_path / "sib")
        _write_tsv(folder / "dev.tsv", [])
        expected = [str(folder / "dev.tsv"), "holds no record (an empty split)"]
        layout, path = "sib200", folder
    elif case == "malformed line":
        path = _jsonl(tmp_path / "nob_Latn.jsonl", records, blank_line_after=0)
        path.write_text(
            path.read_text(encoding="utf-8") + '{"flores_passage": "cut sh\n', encoding="utf-8"
        )
        expected = [str(path), "line 5: not a JSON object"]
        layout = "belebele"
    elif case == "not a folder":
        expected = ["is not a folder"]
        layout, path = "sib200", _jsonl(tmp_path / "x.jsonl", records)
    else:
        field, value = {
            "answer number 5": ("correct_answer_num", 5),
            "answer number text": ("correct_answer_num", "B"),
            "empty answer": ("mc_answer3", " "),
        }[case]
        records[2] = _belebele_record(**{field: value})
        # a blank line before the bad record: the line number is still the file's
        path = _jsonl(tmp_path / "nob_Latn.jsonl", records, blank_line_after=0)
        expected = [str(path), "line 4", f"`{field}`"]
        layout = "belebele"
    with pytest.raises(StageError) as error:
        _read(layout, path, tmp_path)
    for part in expected:
        assert part in str(error.value), (part, str(error.value))


def _independent_log_likelihood(
    hf_model, tokenizer, start_id, context: str, continuation: str, window: int
) -> float:
    """transformers' model on the start token, the context and the continuation (the last `window` +
    1 tokens): the summed log-probabilities of the continuation's tokens, split as
    lm-evaluation-harness splits them (lm_eval/api/model.py, _encode_pair): the whole text tokenized,
    the continuation being what follows the context's tokens, after the context's trailing spaces
    moved to the continuation; an empty context: the continuation alone."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if context:
        context_ids = tokenizer.encode(context, add_special_tokens=False).ids
        whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
        continuation_ids = whole[len(context_ids) :]
    else:
        context_ids = []
        continuation_ids = tokenizer.encode(continuation, add_special_tokens=False).ids
    ids = torch.tensor([[start_id, *context_ids, *continuation_ids][-(window + 1) :]])
    with torch.no_grad():
        log_probs = F.log_softmax(hf_model(ids[:, :-1]).logits[0].double(), dim=-1)
    return float(log_probs.gather(-1, ids[0, 1:, None])[-len(continuation_ids) :].sum())


def test_log_likelihoods_and_hidden_states_match_transformers(english_base):
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(english_base, dtype=torch.float32).eval()
    model, tokenizer = load_base(str(english_base)).eval(), load_tokenizer(str(english_base))
    start_id = token_roles(english_base, tokenizer)["eos"]
    # the second context is longer than the window: it loses its start, never the answer
    pairs = [
        ("The cat sat on the", " mat"),
        (("It was a dark and stormy night. " * 40).strip(), " The rain fell."),
        ("", " Once upon a time"),
        ("Question: what is two and two?", "\nfour"),
        ("Answer: ", "B"),  # the context's trailing space goes to the continuation, as lm-eval does
    ]
    window = model.cfg.max_seq_len
    assert len(tokenizer.encode(pairs[1][0]).ids) > window
    scorer = ScoringModel(
        model, tokenizer, start_id, window, batch_size=3, device=torch.device("cpu")
    )
    ours = continuation_log_likelihoods(scorer, pairs)
    for value, (context, continuation) in zip(ours, pairs):
        assert value == pytest.approx(
            _independent_log_likelihood(
                hf_model, tokenizer, start_id, context, continuation, window
            ),
            rel=1e-4,
            abs=1e-4,
        )

    ids = torch.tensor([[start_id, *tokenizer.encode("The whale swam past the ship.").ids]])
    with torch.no_grad():
        expected = hf_model(ids, output_hidden_states=True).hidden_states[-1]
        assert torch.allclose(model.hidden_states(ids), expected, atol=1e-4)
        assert torch.equal(model.head(model.hidden_states(ids)), model(ids))


def _english_heldout() -> list[dict]:
    """Held-out English documents as the clean stage writes them: Gutenberg books (cut short) and UD
    sentences, each with its raw file in the metadata."""
    records = read_jsonl_gz(DATA / "eng")
    books = [record for record in records if not record["id"].startswith("UD_")][:12]
    sentences = [record for record in records if record["id"].startswith("UD_")][:240]
    chosen = [
        {
            "text": record["text"][:3000],
            "id": record["id"],
            "metadata": {"raw_file": "gutenberg_pd_books.jsonl.gz"},
        }
        for record in books
    ]
    chosen += [
        {"text": record["text"], "id": record["id"], "metadata": {"raw_file": "ud_dev.jsonl.gz"}}
        for record in sentences
    ]
    return chosen[::2] + chosen[1::2]  # books and sentences mixed, in a fixed order


def test_source_label_is_the_first_word_of_the_raw_file():
    assert source_label({"raw_file": "nob/lovdata_lovtidend_2025.jsonl.gz"}) == "lovdata"
    assert source_label({"raw_file": "npk_cc0_sentences.jsonl.gz"}) == "npk"
    assert source_label({}) == "unknown"


def test_held_out_tasks_beat_chance_and_a_random_model(tmp_path, english_base):
    records = _english_heldout()
    work = tmp_path / "work"
    clean = _clean_output(work / "eng" / "clean", {})
    write_jsonl_gz(clean / "heldout" / "000_00000.jsonl.gz", records)
    _trained_output(
        work, "pretrain", _variant(english_base, tmp_path / "random", noise=None), lang="eng"
    )
    user_task = _jsonl(
        tmp_path / "capitals.jsonl", [_belebele_record(), _belebele_record(correct_answer_num=1)]
    )
    tasks = f"eval.tasks=[{{layout:belebele,path:{user_task},language:nob,name:capitals}}]"
    options = (
        "stage=evaluate",
        "lang=eng",
        f"model.base={english_base}",
        "eval.max_bytes=200000",
        tasks,
    )
    run_cli(*options, cwd=tmp_path)

    out = work / "eng" / "evaluate"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert (
        list(report["tasks"]) == ["capitals", "source", "continuation"]
        and report["skipped_tasks"] == {}
    )
    source, continuation = report["tasks"]["source"], report["tasks"]["continuation"]
    assert (
        source["labels"] == ["gutenberg", "ud"]
        and source["test"] >= 40
        and continuation["test"] >= 150
    )
    assert (
        Path(source["path"]) == out / "tasks" / "source"
        and (out / "tasks" / "source" / "test.tsv").is_file()
    )
    assert (
        Path(continuation["path"]) == out / "tasks" / "continuation.jsonl"
        and Path(continuation["path"]).is_file()
    )
    for task in report["tasks"].values():
        assert list(task["results"]) == ["base", "pretrain"]
        for by_scoring in task["results"].values():
            for result in by_scoring.values():
                low, high = result["interval_95"]
                assert low <= result["accuracy"] <= high and result["n"] == task["test"]
                assert (low, high) == pytest.approx(wilson_interval(result["correct"], result["n"]))
    assert list(source["results"]["base"]) == [
        "linear_probe_acc",
        "acc",
        "acc_norm",
        "acc_bytes",
        "acc_mutual_info",
    ]
    assert list(continuation["results"]["base"]) == [
        "acc",
        "acc_norm",
        "acc_bytes",
        "acc_mutual_info",
    ]
    assert continuation["layout"] == "continuation"
    trained, random = continuation["results"]["base"], continuation["results"]["pretrain"]
    gain = "acc_mutual_info"
    # The trained model reads the passage: above chance by its interval, and above the random model.
    assert trained[gain]["interval_95"][0] > trained[gain]["chance"] == 0.25
    assert trained[gain]["accuracy"] > random[gain]["accuracy"] + 0.05
    probe = source["results"]["base"]["linear_probe_acc"]
    assert probe["interval_95"][0] > probe["chance"] == 0.5

    metrics = marker(work, "eng", "evaluate")["metrics"]
    assert metrics["tasks"]["continuation"]["base"][gain] == trained[gain]["accuracy"]
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "## Downstream tasks" in markdown and "### continuation" in markdown
    low, high = trained[gain]["interval_95"]
    assert f"{trained[gain]['accuracy']:.3f} [{low:.3f}, {high:.3f}]" in markdown

    # A bad task file fails before any model loads, naming the file, the line and the field.
    _jsonl(user_task, [_belebele_record(), _belebele_record(correct_answer_num=7)])
    bad = run_cli(*options, cwd=tmp_path, check=False)
    assert bad.returncode == 1 and f"{user_task}, line 2, field `correct_answer_num`" in bad.stderr
    assert "bits per byte" not in bad.stderr
