"""Stage `warmup` with a transfer that learns from the language's text, through the real CLI: the clean
stage's training text reaches it, its cost lands in the report, and the body stays frozen."""

from __future__ import annotations

from tests.conftest import CHAIN_OPTIONS, marker, run_cli
from tests.stages.test_warmup import WARMUP_OPTIONS


def test_focus_learns_from_the_clean_text_and_only_the_embeddings_train(nob_packed, english_base):
    run_cli("stage=warmup", *CHAIN_OPTIONS, f"model.base={english_base}", *WARMUP_OPTIONS, "warmup.init=focus",
            "warmup.transfer_bytes=200000", "warmup.train.steps=2", cwd=nob_packed)
    metrics = marker(nob_packed / "work", "nob", "warmup")["metrics"]
    rows = metrics["rows"]
    assert rows["method"] == "focus" and rows["embedding"]["focus"] > 100 and rows["embedding"]["copied"] > 100
    assert rows["learnt_from"]["text_tokens"] > 10_000 and "fallback" not in rows["learnt_from"]
    assert rows["cost"]["seconds"] > 0 and rows["cost"]["peak_rss_mib"] > 0
    # The stage checks that every other tensor kept the base's values bit for bit: the tied base trains its embedding.
    assert metrics["trained_tensors"] == ["embedding.tokens.weight"]
    assert metrics["heldout_bpb_after"] < metrics["heldout_bpb_before"]
