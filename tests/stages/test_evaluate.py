"""Stage `evaluate`: bits per byte against an independent computation, whole documents against
windows, the stage's report on three held-out sets, and the flag on a trained model worse than the
base."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models

from pipeline.evaluation.bits_per_byte import (
    IGNORE,
    ScoringRows,
    score_documents,
    score_rows,
    scoring_rows,
    windows,
)
from pipeline.evaluation.generation import greedy_continuation
from pipeline.evaluation.models import first_added_id
from pipeline.evaluation.report import find_regressions, markdown
from pipeline.model.files import load_base
from pipeline.model.hf_export import to_hf
from pipeline.model.transformer import Transformer
from pipeline.tokenization.folder import load_tokenizer, token_roles
from pipeline.training.heldout import save_rows
from tests.conftest import DATA, marker, read_jsonl_gz, run_cli, write_jsonl_gz


@pytest.mark.parametrize(
    "targets,seq_len,stride",
    [(1, 8, 4), (8, 8, 4), (9, 8, 4), (50, 8, 3), (50, 8, 8), (17, 16, 1), (100, 128, 16)],
)
def test_windows_score_every_token_once_with_the_context_they_can(targets, seq_len, stride):
    scored = []
    for window in windows(0, targets, seq_len, stride):
        assert (
            0 < window.end - window.begin <= seq_len
            and 0 < window.scored <= window.end - window.begin
        )
        scored.extend(
            range(window.end - window.scored, window.end)
        )  # input positions whose next token counts
        # context: everything before the window's scored part, up to the window's length
        assert window.begin == max(0, window.end - seq_len)
    assert scored == list(range(targets))


def test_held_out_rows_stop_at_the_token_budget_inside_the_document_that_crosses_it(english_base):
    tokenizer = load_tokenizer(str(english_base))
    short, long = _documents()[0], " ".join(_documents())
    first = len(tokenizer.encode(short, add_special_tokens=False).ids)
    rows = scoring_rows([short, long, "never reached"], tokenizer, 0, 32, 16, max_tokens=first + 20)
    assert rows.documents == 2 and rows.tokens == first + 20
    assert int((rows.labels != IGNORE).sum()) == first + 20  # every kept token scored once, no more
    # The bytes are those of the text the 20 kept tokens of the long document cover.
    end = tokenizer.encode(long, add_special_tokens=False).offsets[19][1]
    assert 0 < end < len(long) and rows.bytes == len(short.encode("utf-8")) + len(
        long[:end].encode("utf-8")
    )


def _documents() -> list[str]:
    """Norwegian sentences grouped into documents (UD), short and long; with non-ASCII letters."""
    texts = [
        record["text"] for record in read_jsonl_gz(DATA / "nob") if record["id"].startswith("UD_")
    ]
    return [texts[0][:180], texts[1][:120], "æøå ÆØÅ – «sitat»", texts[2][:170]]


def _independent_bits_per_byte(folder, texts, start_id) -> float:
    """transformers' model on each whole document: -sum log p(token | prefix) in bits over the UTF-8
    bytes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(folder)
    nats, size = 0.0, 0
    for text in texts:
        ids = torch.tensor([[start_id, *tokenizer.encode(text, add_special_tokens=False).ids]])
        assert ids.shape[1] <= model.config.max_position_embeddings
        with torch.no_grad():
            log_probs = F.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
        nats -= log_probs.gather(-1, ids[0, 1:, None]).sum().item()
        size += len(text.encode("utf-8"))
    return nats / math.log(2) / size


def test_bits_per_byte_matches_transformers_and_windows_change_nothing_within_the_context(
    english_base,
):
    model, tokenizer = load_base(str(english_base)).eval(), load_tokenizer(str(english_base))
    start_id = token_roles(english_base, tokenizer)["eos"]
    texts = _documents()
    lengths = [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    context = model.cfg.max_seq_len
    assert max(lengths) <= context and max(lengths) > 4 * 16, (
        lengths
    )  # windows of stride 16 really cut them

    def score(stride, batch_size):
        return score_documents(
            model, tokenizer, texts, start_id, context, stride, batch_size, torch.device("cpu")
        )

    whole = score(stride=context, batch_size=1)
    assert whole.tokens == sum(lengths) and whole.bytes == sum(
        len(t.encode("utf-8")) for t in texts
    )
    assert whole.bits_per_byte == pytest.approx(
        _independent_bits_per_byte(english_base, texts, start_id), rel=1e-5
    )
    windowed = score(stride=16, batch_size=3)
    assert windowed.tokens == whole.tokens
    assert abs(windowed.bits_per_byte - whole.bits_per_byte) < 1e-6
    # windows of 16 tokens without overlap really cut the context: the same tokens, a different
    # score
    short_context = score_documents(
        model, tokenizer, texts, start_id, 16, 16, 4, torch.device("cpu")
    )
    assert (
        short_context.tokens == whole.tokens
        and abs(short_context.bits_per_byte - whole.bits_per_byte) > 1e-3
    )


def test_evaluate_stage_reports_the_base_model_on_a_plain_text_file(tmp_path, english_base):
    texts = _documents()
    text_file = tmp_path / "heldout.nob.txt"
    text_file.write_text("\n".join(texts) + "\n", encoding="utf-8")
    options = ("stage=evaluate", "lang=nob", f"model.base={english_base}", f"eval.path={text_file}")
    first = run_cli(*options, cwd=tmp_path)
    out = tmp_path / "work" / "nob" / "evaluate"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    start_id = token_roles(english_base, load_tokenizer(str(english_base)))["eos"]
    assert list(report["scores"]) == ["base"]
    assert report["scores"]["base"]["heldout"]["bits_per_byte"] == pytest.approx(
        _independent_bits_per_byte(english_base, texts, start_id), rel=1e-5
    )
    assert report["scores"]["base"]["heldout"]["documents"] == len(texts)
    assert (out / "bpb.png").stat().st_size > 1000 and "| base |" in (out / "report.md").read_text(
        encoding="utf-8"
    )
    # No clean stage and no text of the base's language: those sets are skipped, and the log and the
    # report say why.
    assert list(report["sets"]) == ["heldout"] and list(report["skipped_sets"]) == [
        "heldout_source",
        "base_lang",
    ]
    assert (
        "the `base_lang` set is not scored: no held-out text of the base model's language eng"
        in first.stderr
    )
    assert "not scored: `heldout_source`" in (out / "report.md").read_text(encoding="utf-8")

    again = run_cli(*options, cwd=tmp_path)
    assert "Skipping evaluate for nob" in again.stderr
    missing = run_cli("stage=evaluate", "lang=nob", "work_dir=elsewhere", cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "no model to evaluate" in missing.stderr


def test_regressions_are_the_trained_models_worse_than_the_base_on_a_set():
    bpb = {
        "base": {"heldout": 2.0, "base_lang": 1.0},
        "warmup": {"heldout": 1.5, "base_lang": 1.2},
        "pretrain": {"heldout": 2.5, "base_lang": 1.0},
    }
    assert find_regressions(bpb) == [
        {"model": "warmup", "set": "base_lang", "bits_per_byte": 1.2, "base_bits_per_byte": 1.0},
        {"model": "pretrain", "set": "heldout", "bits_per_byte": 2.5, "base_bits_per_byte": 2.0},
    ]
    assert (
        find_regressions({name: bpb[name] for name in ("warmup", "pretrain")}) == []
    )  # no base: nothing to flag


class _FixedLogits(torch.nn.Module):
    """A model whose logits are the same at every position: 0 for the base's ids, `added_logit` for
    the added."""

    def __init__(self, vocab: int, first_added: int, added_logit: float):
        super().__init__()
        self.logits = torch.zeros(vocab)
        self.logits[first_added:] = added_logit

    def forward(self, inputs, segment_ids):
        return self.logits.expand(*inputs.shape, -1)


def test_the_added_tokens_share_of_the_probability_where_a_base_token_is_the_target():
    # 6 base tokens, 4 added with logit log 3: each added token 3 times as likely as each base token
    first_added, model = 6, _FixedLogits(10, 6, math.log(3.0))
    labels = np.array(
        [[IGNORE, 1, 7, 2, 9, 5, IGNORE, IGNORE], [3, 6, IGNORE, 0, 0, IGNORE, IGNORE, IGNORE]]
    )
    rows = ScoringRows(
        np.zeros_like(labels), labels, np.zeros_like(labels), bytes=1, tokens=9, documents=2
    )
    share = score_rows(model, rows, 1, torch.device("cpu"), first_added=first_added).added
    assert share == {
        "first_added": 6,
        "mass": pytest.approx(12 / 18),
        "base_targets": 6,
        "added_targets": 3,
    }
    assert (
        score_rows(model, rows, 2, torch.device("cpu"), first_added=first_added).added == share
    )  # batches: the same


def test_a_tokenizer_extends_the_base_when_every_base_token_keeps_its_id():
    base, extended = (
        Tokenizer(models.BPE({"a": 0, "b": 1}, [])),
        Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")])),
    )
    assert first_added_id(base.get_vocab(), extended) == 2
    assert (
        first_added_id(
            base.get_vocab(), Tokenizer(models.BPE({"b": 0, "a": 1, "ab": 2}, [("a", "b")]))
        )
        is None
    )
    assert first_added_id(base.get_vocab(), base) is None and first_added_id(None, extended) is None


def test_a_flag_on_the_base_language_says_what_the_added_tokens_take():
    sets = {
        name: {"title": title, "text": "", "documents": 1, "bytes": 1}
        for name, title in (("heldout", "held-out split"), ("base_lang", "eng held-out"))
    }
    scores = {
        model: {
            name: {
                "bits_per_byte": value,
                "interval_95": [value - 0.01, value + 0.01],
                "token_perplexity": 2.0,
                "tokens_per_byte": 0.25,
                "tokens": 1,
                "bytes": 1,
            }
            for name, value in (("heldout", 2.0 - step), ("base_lang", 1.0 + step))
        }
        for model, step in (("base", 0.0), ("warmup", 0.01))
    }
    added = {
        "set": "base_lang",
        "models": {
            "warmup": {
                "first_added": 49152,
                "mass": 0.0037,
                "base_targets": 121541,
                "added_targets": 50,
            }
        },
    }
    report = {
        "sets": sets,
        "skipped_sets": {},
        "scores": scores,
        "models": {"base": "b", "warmup": "w"},
        "regressions": find_regressions(
            {m: {n: v["bits_per_byte"] for n, v in s.items()} for m, s in scores.items()}
        ),
        "added_tokens": added,
        "training_heldout": {},
        "tasks": {},
        "skipped_tasks": {},
        "headline": [],
        "cost": {},
        "continuations": {"words": 30, "new_tokens": 32, "prompts": []},
    }
    text = markdown("nob", report, [])
    assert "WARNING: warmup is worse than the base model on the eng held-out set" in text
    assert (
        "On the eng held-out set the added tokens (ids from 49,152) take this share of the "
        "probability where a "
        "base token is the target: warmup 0.37% (0.0053 bits per token), 50 of 121,591 targets "
        "added tokens"
    ) in text
    # flagged on another set only: the line is not there
    report["regressions"] = [{**report["regressions"][0], "set": "heldout"}]
    assert "the added tokens" not in markdown("nob", report, [])


def _clean_output(folder: Path, splits: dict[str, list[str]], metrics: dict | None = None) -> Path:
    """A finished clean stage output as `clean` writes it: its marker (with `metrics`), and gzipped
    JSONL shards of datatrove's JsonlWriter records per split (`heldout`, `heldout_source`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, texts in splits.items():
        write_jsonl_gz(
            folder / split / "000_00000.jsonl.gz",
            [
                {"text": text, "id": f"{split}/{index}", "metadata": {"minhash_cluster_size": 1}}
                for index, text in enumerate(texts)
            ],
        )
    (folder / "_SUCCESS.json").write_text(
        json.dumps(
            {
                "stage": "clean",
                "lang": folder.parent.name,
                "config_hash": f"test-{folder.parent.name}",
                "metrics": metrics or {},
            }
        )
    )
    return folder


def _trained_output(
    work: Path, stage: str, model_folder: Path, lang: str = "nob", metrics: dict | None = None
) -> None:
    """A finished warmup or pretrain output whose exported model is `model_folder`."""
    shutil.copytree(model_folder, work / lang / stage / "hf")
    (work / lang / stage / "_SUCCESS.json").write_text(
        json.dumps(
            {"stage": stage, "lang": lang, "config_hash": f"test-{stage}", "metrics": metrics or {}}
        )
    )


def _variant(english_base: Path, folder: Path, noise: float) -> Path:
    """The English base with Gaussian noise of standard deviation `noise` on every weight (its
    tokenizer kept); with noise=None a random model of its shape."""
    model = load_base(str(english_base))
    torch.manual_seed(1)
    if noise is None:
        model = Transformer(model.cfg)
    else:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(noise * torch.randn_like(parameter))
    return to_hf(model, folder, tokenizer=english_base)


def test_the_base_languages_text_is_a_source_its_clean_stage_held_out_whole_when_there_is_one(
    tmp_path,
):
    from omegaconf import OmegaConf

    from pipeline.config import PipelineConfig
    from pipeline.evaluation.texts import (
        HELDOUT_SOURCE_SPLIT,
        HELDOUT_SPLIT,
        base_lang_sets,
        heldout_source_set,
    )
    from pipeline.languages import LANGUAGES, language_config

    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(PipelineConfig),
            {"lang": OmegaConf.structured(language_config("nob", LANGUAGES["nob"]))},
            {"stage": "evaluate", "work_dir": str(tmp_path / "work")},
        )
    )
    eng = tmp_path / "work" / "eng" / "clean"
    _clean_output(eng, {"heldout": ["Pages of a book the replay reads."]})
    assert [text_set.split for text_set in base_lang_sets(cfg)] == [HELDOUT_SPLIT]
    # the replay repeats the books it reads: a book it never reads is the fairer test, and comes
    # first
    _clean_output(eng, {"heldout_source": ["A book it never reads."]})
    (chosen,) = base_lang_sets(cfg)
    assert chosen.split == HELDOUT_SOURCE_SPLIT and str(eng / HELDOUT_SOURCE_SPLIT) in chosen.where
    # Several held-out sources (the table's English: a novel, and UD's web text, a kind the replay
    # never reads): a set each, with its own documents only.
    book, web = "*Sherlock-Holmes*", "ud_*"
    _clean_output(eng, {}, metrics={"heldout_source_patterns": [book, web]})
    write_jsonl_gz(
        eng / HELDOUT_SOURCE_SPLIT / "000_00000.jsonl.gz",
        [
            {
                "text": "A book it never reads.",
                "id": "b",
                "metadata": {
                    "raw_file": "gutenberg.jsonl.gz",
                    "source": "GITenberg/The-Sherlock-Holmes_1661",
                },
            },
            *(
                {
                    "text": text,
                    "id": text,
                    "metadata": {"raw_file": "ud_test.jsonl.gz", "source": "UD_English-EWT"},
                }
                for text in ("A review.", "An email.")
            ),
        ],
    )
    sets = base_lang_sets(cfg)
    assert [text_set.name for text_set in sets] == [f"base_lang:{book}", f"base_lang:{web}"]
    assert [
        [text for text, _ in text_set.records(tmp_path / "scratch", 10**6)] for text_set in sets
    ] == [["A book it never reads."], ["A review.", "An email."]]
    assert sets[0].identity() != sets[1].identity()
    # The evaluated language's own held-out sources are split the same way (nob: regjeringen.no's
    # white papers apart from UD's news and blogs).
    own = heldout_source_set("eng", eng)
    assert [text_set.name for text_set in own] == [
        f"heldout_source:{book}",
        f"heldout_source:{web}",
    ]
    assert [text_set.records(tmp_path / "own", 10**6) for text_set in own] == [
        text_set.records(tmp_path / "scratch", 10**6) for text_set in sets
    ]


# What the training stages recorded (their markers, pretrain's metrics.jsonl): warmup's layout only by
# its ranks' peak memory, and no MFU (a CPU).
WARMUP_COST = {
    "tokens": 4096,
    "seconds": 12.5,
    "tokens_per_s": 327.7,
    "peak_memory_per_rank": [{"rank": 0}],
}
PRETRAIN_COST = {
    "tokens": 8192,
    "seconds": 90.0,
    "tokens_per_s": 91.0,
    "parallel": {"tp": 1, "pp": 1, "dp": 2},
}
PRETRAIN_METRICS = [
    {"step": 0, "heldout_bpb": 3.0},
    {"step": 1, "loss": 5.0, "tokens": 4096, "mfu": 0.2},
    {"step": 2, "loss": 4.5, "tokens": 8192, "mfu": 0.4},
]


def _check_the_head_of_the_report(report: dict, text: str, metrics: dict) -> None:
    """The headline (base against pretrain, the final model), the intervals and the cost."""
    scores = report["scores"]
    for model, by_set in scores.items():
        for name, score in by_set.items():
            low, high = score["interval_95"]
            assert low < score["bits_per_byte"] < high
            assert metrics["bits_per_byte_interval_95"][model][name] == [low, high]
    rows = [row for row in report["headline"] if row["measure"] == "bits per byte"]
    assert [row["set"] for row in rows] == list(report["sets"])
    for row in rows:
        assert row["model"] == "pretrain" and row["n"] == report["sets"][row["set"]]["documents"]
        assert row["base"] == scores["base"][row["set"]]["bits_per_byte"]
        assert row["final"] == scores["pretrain"][row["set"]]["bits_per_byte"]
        low, high = row["interval_95"]
        assert row["change"] == pytest.approx(row["final"] - row["base"]) and row["change"] > 0
        assert low < row["change"] < high, row
        assert row["verdict"] == ("worse" if low > 0 else "not told apart"), row
        assert (
            f"| bits per byte, {row['title']} | {row['n']} | {row['base']:.4f} | "
            f"{row['final']:.4f} | {row['change']:+.4f} "
        ) in text
    # A random model against an English one on English text: worse on every document, and told so.
    assert rows[-1]["set"] == "base_lang" and rows[-1]["verdict"] == "worse", rows
    for row in report["headline"][len(rows) :]:
        base = report["tasks"][row["task"]]["results"]["base"][row["scoring"]]["accuracy"]
        final = report["tasks"][row["task"]]["results"]["pretrain"][row["scoring"]]["accuracy"]
        assert (row["base"], row["final"]) == (base, final)
        assert row["interval_95"][0] <= row["change"] <= row["interval_95"][1]
    # The report opens with the headline, then the cost, the continuations, then the details.
    order = ["## Headline: base -> pretrain", "## Cost of the run", "## Greedy continuations"]
    assert sorted(order, key=text.index) == order and text.index(order[-1]) < text.index(
        "## Held-out sets"
    )
    cost = report["cost"]
    assert cost["pretrain"] == {
        "tokens": 8192,
        "seconds": 90.0,
        "tokens_per_s": 91.0,
        "mfu": pytest.approx(8192 / (4096 / 0.2 + 4096 / 0.4)),
        "devices": 2,
        "device_hours": pytest.approx(0.05),
    }
    assert cost["warmup"]["mfu"] is None and cost["warmup"]["devices"] == 1
    assert "| pretrain | 8,192 | 1m 30s | 91 | 26.7% | 2 | 0.050 |" in text
    assert "| warmup | 4,096 | 0m 12s | 328 | not recorded | 1 | 0.003 |" in text
    assert "| total | 12,288 | 1m 42s |  |  |  | 0.053 |" in text
    assert re.search(r"\bnan\b", text, re.IGNORECASE) is None


def _check_the_continuations(report: dict, text: str, heldout: list[str], english_base) -> None:
    """Three prompts of the held-out split, each continued by every model; the English model's
    (warmup's) is what a greedy loop over it writes."""
    assert (report["continuations"]["words"], report["continuations"]["new_tokens"]) == (30, 32)
    continuations = report["continuations"]["prompts"]
    assert [entry["prompt"] for entry in continuations] == [
        " ".join(document.split()[:30]) for document in heldout[:3]
    ]
    model, tokenizer = load_base(str(english_base)).eval(), load_tokenizer(str(english_base))
    start_id = token_roles(english_base, tokenizer)["eos"]
    for entry in continuations:
        assert list(entry["models"]) == ["base", "warmup", "pretrain"]
        assert entry["models"]["warmup"] == greedy_continuation(
            model,
            tokenizer,
            entry["prompt"],
            start_id,
            start_id,
            model.cfg.max_seq_len,
            torch.device("cpu"),
        )
        assert entry["prompt"] in text
    assert any(entry["models"]["warmup"].strip() for entry in continuations)


def test_three_held_out_sets_and_a_trained_model_worse_than_the_base_is_flagged(
    tmp_path, english_base
):
    nob = [record["text"] for record in read_jsonl_gz(DATA / "nob")]
    eng = [
        record["text"][:400]
        for record in read_jsonl_gz(DATA / "eng")
        if record["id"].startswith("UD_")
    ]
    heldout, heldout_source, eng_heldout = nob[300:306], [text[:150] for text in nob[:3]], eng[:8]
    work = tmp_path / "work"
    _clean_output(work / "nob" / "clean", {"heldout": heldout, "heldout_source": heldout_source})
    _clean_output(work / "eng" / "clean", {"heldout": eng_heldout})
    # base: the English model blurred by noise; warmup: the English model itself (better
    # everywhere); pretrain: a random model of that shape (worse everywhere).
    base = _variant(english_base, tmp_path / "blurred", noise=0.05)
    # The training stages' own held-out rows (short documents: one window each), as they keep them;
    # warmup logged the true score of its model on them (transformers'), pretrain a wrong one.
    start_id = token_roles(english_base, load_tokenizer(str(english_base)))["eos"]
    training_texts = [text[:150] for text in nob[10:14]]
    rows = scoring_rows(
        training_texts, load_tokenizer(str(english_base)), start_id, 128, 64
    ).padded_to(4)
    logged = _independent_bits_per_byte(english_base, training_texts, start_id)
    _trained_output(
        work, "warmup", english_base, metrics={"heldout_bpb_after": logged, **WARMUP_COST}
    )
    _trained_output(
        work,
        "pretrain",
        _variant(english_base, tmp_path / "random", noise=None),
        metrics={"heldout_bpb_after": 1.0, **PRETRAIN_COST},
    )
    (work / "nob" / "pretrain" / "metrics.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in PRETRAIN_METRICS), encoding="utf-8"
    )
    for stage in ("warmup", "pretrain"):
        save_rows(rows, work / "nob" / stage / "heldout.npz")
    options = ("stage=evaluate", "lang=nob", f"model.base={base}")
    # Two processes share the three models (as a node's GPUs do); every figure below is checked
    # against transformers or the logged one, and the rerun at the end scores in one process.
    result = run_cli(*options, "workers=2", cwd=tmp_path)
    assert "3 models on 2 CPU devices, one process each" in result.stderr

    out = work / "nob" / "evaluate"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    sets = ["heldout", "heldout_source", "base_lang"]
    assert list(report["sets"]) == sets and report["skipped_sets"] == {}
    for name, texts in zip(sets, (heldout, heldout_source, eng_heldout)):
        assert report["sets"][name]["documents"] == len(texts)
        assert report["sets"][name]["bytes"] == sum(len(text.encode("utf-8")) for text in texts)
    assert "eng" in report["sets"]["base_lang"]["title"]
    # The held-out source's text is what was scored: the base's score is transformers' on those
    # documents.
    assert report["scores"]["base"]["heldout_source"]["bits_per_byte"] == pytest.approx(
        _independent_bits_per_byte(base, heldout_source, start_id), rel=1e-4
    )

    bpb = marker(work, "nob", "evaluate")["metrics"]["bits_per_byte"]
    assert list(bpb) == ["base", "warmup", "pretrain"] and all(
        list(bpb[model]) == sets for model in bpb
    )
    assert all(
        bpb[model][name] == report["scores"][model][name]["bits_per_byte"]
        for model in bpb
        for name in sets
    )
    for name in sets:
        assert bpb["warmup"][name] < bpb["base"][name] < bpb["pretrain"][name], (name, bpb)
    expected = [
        {
            "model": "pretrain",
            "set": name,
            "bits_per_byte": bpb["pretrain"][name],
            "base_bits_per_byte": bpb["base"][name],
        }
        for name in sets
    ]
    assert (
        report["regressions"]
        == expected
        == marker(work, "nob", "evaluate")["metrics"]["regressions"]
    )
    markdown = (out / "report.md").read_text(encoding="utf-8")
    for title in (report["sets"][name]["title"] for name in sets):
        line = f"WARNING: pretrain is worse than the base model on the {title} set"
        assert line in result.stderr and f"**{line}" in markdown
    assert "warmup is worse" not in markdown + result.stderr
    # The exported models rescore their stages' own held-out rows: warmup's agrees with what it
    # logged, pretrain's logged number is not what its model gives, and the report says so.
    reproduced = report["training_heldout"]
    assert (
        reproduced["warmup"]["rescored"] == pytest.approx(logged, rel=1e-4)
        and reproduced["warmup"]["agree"]
    )
    assert reproduced["warmup"]["documents"] == 4 and reproduced["warmup"]["seq_len"] == 128
    assert not reproduced["pretrain"]["agree"] and reproduced["pretrain"]["rescored"] > 5
    disagreement = "WARNING: pretrain's exported model scores"
    assert (
        disagreement in result.stderr
        and f"**{disagreement}" in markdown
        and "warmup's exported"
        not in "".join(line for line in markdown.splitlines() if line.startswith("**"))
    )
    assert marker(work, "nob", "evaluate")["metrics"]["training_heldout"]["warmup"]["agree"] is True
    _check_the_head_of_the_report(report, markdown, marker(work, "nob", "evaluate")["metrics"])
    _check_the_continuations(report, markdown, heldout, english_base)

    # The base language's text enters the stage's hash: without it the stage runs again and skips
    # that set.
    (work / "eng" / "clean" / "_SUCCESS.json").unlink()
    again = run_cli(*options, cwd=tmp_path)
    assert "Running evaluate for nob" in again.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert list(report["sets"]) == sets[:2] and list(report["skipped_sets"]) == ["base_lang"]
