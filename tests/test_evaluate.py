"""Stage `evaluate`: bits per byte against an independent computation, whole documents against windows, the
stage's report."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.evaluation.bits_per_byte import score_documents, windows
from pipeline.model.files import load_base
from pipeline.tokenization.folder import load_tokenizer, token_roles
from tests.conftest import DATA, read_jsonl_gz, run_cli


@pytest.mark.parametrize("targets,seq_len,stride", [(1, 8, 4), (8, 8, 4), (9, 8, 4), (50, 8, 3), (50, 8, 8),
                                                    (17, 16, 1), (100, 128, 16)])
def test_windows_score_every_token_once_with_the_context_they_can(targets, seq_len, stride):
    scored = []
    for window in windows(0, targets, seq_len, stride):
        assert 0 < window.end - window.begin <= seq_len and 0 < window.scored <= window.end - window.begin
        scored.extend(range(window.end - window.scored, window.end))  # input positions whose next token counts
        # context: everything before the window's scored part, up to the window's length
        assert window.begin == max(0, window.end - seq_len)
    assert scored == list(range(targets))


def _documents() -> list[str]:
    """Norwegian sentences grouped into documents (UD), short and long; with non-ASCII letters."""
    texts = [record["text"] for record in read_jsonl_gz(DATA / "nob") if record["id"].startswith("UD_")]
    return [texts[0][:180], texts[1][:120], "æøå ÆØÅ – «sitat»", texts[2][:170]]


def _independent_bits_per_byte(folder, texts, start_id) -> float:
    """transformers' model on each whole document: -sum log p(token | prefix) in bits over the UTF-8 bytes."""
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


def test_bits_per_byte_matches_transformers_and_windows_change_nothing_within_the_context(english_base):
    model, tokenizer = load_base(str(english_base)).eval(), load_tokenizer(str(english_base))
    start_id = token_roles(english_base, tokenizer)["eos"]
    texts = _documents()
    lengths = [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    context = model.cfg.max_seq_len
    assert max(lengths) <= context and max(lengths) > 4 * 16, lengths  # windows of stride 16 really cut them

    def score(stride, batch_size):
        return score_documents(model, tokenizer, texts, start_id, context, stride, batch_size, torch.device("cpu"))

    whole = score(stride=context, batch_size=1)
    assert whole.tokens == sum(lengths) and whole.bytes == sum(len(t.encode("utf-8")) for t in texts)
    assert whole.bits_per_byte == pytest.approx(_independent_bits_per_byte(english_base, texts, start_id), rel=1e-5)
    windowed = score(stride=16, batch_size=3)
    assert windowed.tokens == whole.tokens
    assert abs(windowed.bits_per_byte - whole.bits_per_byte) < 1e-6
    # windows of 16 tokens without overlap really cut the context: the same tokens, a different score
    short_context = score_documents(model, tokenizer, texts, start_id, 16, 16, 4, torch.device("cpu"))
    assert short_context.tokens == whole.tokens and abs(short_context.bits_per_byte - whole.bits_per_byte) > 1e-3


def test_evaluate_stage_reports_the_base_model_on_a_plain_text_file(tmp_path, english_base):
    texts = _documents()
    text_file = tmp_path / "heldout.nob.txt"
    text_file.write_text("\n".join(texts) + "\n", encoding="utf-8")
    options = ("stage=evaluate", "lang=nob", f"model.base={english_base}", f"eval.path={text_file}")
    run_cli(*options, cwd=tmp_path)
    out = tmp_path / "work" / "nob" / "evaluate"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    start_id = token_roles(english_base, load_tokenizer(str(english_base)))["eos"]
    assert list(report["scores"]) == ["base"]
    assert report["scores"]["base"]["bits_per_byte"] == pytest.approx(
        _independent_bits_per_byte(english_base, texts, start_id), rel=1e-5)
    assert report["scores"]["base"]["documents"] == len(texts)
    assert (out / "bpb.png").stat().st_size > 1000 and "| base |" in (out / "report.md").read_text(encoding="utf-8")

    again = run_cli(*options, cwd=tmp_path)
    assert "Skipping evaluate for nob" in again.stderr
    missing = run_cli("stage=evaluate", "lang=nob", "work_dir=elsewhere", cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "no model to evaluate" in missing.stderr
