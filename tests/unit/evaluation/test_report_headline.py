"""The head of the evaluate stage's report: the headline table, the cost of the run from the
training stages' markers and metrics, and greedy continuations."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from pipeline.evaluation.generation import greedy_continuation, held_out_prompts
from pipeline.evaluation.summary import (
    NOT_RECORDED,
    cost_section,
    continuations_section,
    headline_section,
    run_mfu,
    total_cost,
    training_cost,
)
from pipeline.evaluation.run import Scored, final_model, headline
from pipeline.evaluation.task_scoring import Accuracy


def _metrics_file(tmp_path, rows: list[dict]):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_the_runs_mfu_weighs_each_logged_interval_by_its_time(tmp_path):
    rows = [
        {"step": 0, "heldout_bpb": 3.0},  # held-out rows have no tokens: skipped
        {"step": 10, "loss": 5.0, "tokens": 1000, "mfu": 0.1},  # 10,000 time units
        {"step": 20, "loss": 4.0, "tokens": 4000, "mfu": 0.3},  # 10,000 time units
    ]
    assert run_mfu(_metrics_file(tmp_path, rows)) == pytest.approx(4000 / 20000)
    # a CPU logs no MFU
    cpu_run = _metrics_file(tmp_path, [{"step": 1, "loss": 5.0, "tokens": 8, "mfu": None}])
    assert run_mfu(cpu_run) is None


def test_the_cost_of_a_stage_from_its_marker_and_nothing_made_up(tmp_path):
    metrics = _metrics_file(tmp_path, [{"step": 5, "loss": 4.0, "tokens": 640, "mfu": 0.25}])
    pretrain = training_cost(
        {
            "tokens": 7864320,
            "seconds": 214.93,
            "tokens_per_s": 36589.8,
            "parallel": {"tp": 2, "pp": 1, "dp": 4},
        },
        metrics,
    )
    assert pretrain == {
        "tokens": 7864320,
        "seconds": 214.93,
        "tokens_per_s": 36589.8,
        "mfu": 0.25,
        "devices": 8,
        "device_hours": pytest.approx(214.93 * 8 / 3600),
    }
    # warmup records no layout: its ranks' peak memory counts them; a NaN speed is not a figure
    warmup = training_cost(
        {
            "tokens": 1000,
            "seconds": 10.0,
            "tokens_per_s": float("nan"),
            "peak_memory_per_rank": [{"rank": 0}],
        },
        None,
    )
    assert warmup["devices"] == 1 and warmup["tokens_per_s"] is None and warmup["mfu"] is None
    assert training_cost({}, None) == dict.fromkeys(pretrain)
    cost = {"warmup": warmup, "pretrain": pretrain}
    assert total_cost(cost) == {
        "tokens": 7865320,
        "seconds": pytest.approx(224.93),
        "device_hours": pytest.approx(10 / 3600 + 214.93 * 8 / 3600),
    }
    text = "\n".join(cost_section(cost))
    assert "| pretrain | 7,864,320 | 3m 35s | 36,590 | 25.0% | 8 | 0.478 |" in text
    assert f"| warmup | 1,000 | 0m 10s | {NOT_RECORDED} | {NOT_RECORDED} | 1 | 0.003 |" in text
    assert "| total | 7,865,320 | 3m 45s |  |  |  | 0.480 |" in text
    assert re.search(r"\bnan\b", text, re.IGNORECASE) is None
    assert "no training to account for" in "\n".join(cost_section({}))


def _row(measure: str, base: float, final: float, low: float, high: float, verdict: str) -> dict:
    about = (
        {"set": "heldout", "title": "held-out split"}
        if measure == "bits per byte"
        else {"task": "source", "scoring": "linear probe"}
    )
    return {
        "measure": measure,
        **about,
        "model": "pretrain",
        "n": 28 if measure == "bits per byte" else 24,
        "base": base,
        "final": final,
        "change": final - base,
        "interval_95": [low, high],
        "verdict": verdict,
    }


def test_the_headline_table_shows_base_final_change_interval_and_verdict():
    rows = [
        _row("bits per byte", 5.4380, 3.2883, -2.30, -2.00, "better"),
        _row("accuracy", 0.750, 0.875, -0.05, 0.30, "not told apart"),
    ]
    text = "\n".join(headline_section(rows))
    assert "## Headline: base -> pretrain" in text
    assert "| measure | n | base | pretrain | change | 95% interval | verdict |" in text
    assert (
        "| bits per byte, held-out split | 28 | 5.4380 | 3.2883 | -2.1497 (-39.5%) | "
        "[-2.3000, -2.0000] | better |"
    ) in text
    assert (
        "| accuracy, source: linear probe | 24 | 0.750 | 0.875 | +0.125 | [-0.050, +0.300] | "
        "not told apart |"
    ) in text
    assert "1,000 resamples" in text
    assert "No base model and trained model to compare" in "\n".join(headline_section([]))


def test_continuations_are_fenced_one_line_each_whatever_the_model_writes():
    entries = [
        {
            "prompt": "Det var en  gang\nen konge",
            "models": {"base": " who was\n\nold", "pretrain": "r som ```het``` Olav", "warmup": ""},
        }
    ]
    lines = continuations_section({"words": 30, "new_tokens": 32, "prompts": entries})
    assert "The first 30 words of the first held-out documents" in lines[2]
    fence = lines.index("````text")  # longer than the model's own backticks
    assert lines[fence + 1 : fence + 6] == [
        "prompt    Det var en gang en konge",
        "base      ... who was old",
        "pretrain  ...r som ```het``` Olav",
        "warmup    ... (nothing: the model ends the document here)",
        "````",
    ]
    assert continuations_section({"words": 30, "new_tokens": 32, "prompts": []}) == []
    assert held_out_prompts(["a  b\nc d", "e", "f", "g"], words=3) == ["a b c", "e", "f"]


class _Counting(torch.nn.Module):
    """Logits that make the next token the last one plus one (the vocabulary of 5: 3 words, eos and
    a padded row that must never be chosen)."""

    def forward(self, inputs, segment_ids=None):
        logits = torch.zeros(*inputs.shape, 6)
        logits[..., 5] = 100.0  # a padded row past the tokenizer's vocabulary
        logits.scatter_(-1, ((inputs + 1) % 5)[..., None], 10.0)
        self.longest = max(getattr(self, "longest", 0), inputs.shape[1])
        return logits


def test_a_greedy_continuation_stops_at_eos_and_reads_at_most_a_window():
    vocabulary = {"a": 0, "b": 1, "c": 2, "d": 3, "</s>": 4}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="</s>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model, cpu = _Counting(), torch.device("cpu")
    # start token, then "a": b, c, d, then eos
    assert greedy_continuation(model, tokenizer, "a", 4, 4, 16, cpu) == " b c d"
    assert greedy_continuation(model, tokenizer, "a", 4, 4, 16, cpu, new_tokens=2) == " b c"
    assert greedy_continuation(model, tokenizer, "d", 4, 4, 3, cpu) == ""
    # without an eos it goes on for `new_tokens`, the window moving on (at most 3 tokens in)
    model = _Counting()
    assert greedy_continuation(model, tokenizer, "a b", 4, None, 3, cpu, new_tokens=6).split() == [
        "c",
        "d",
        "</s>",
        "a",
        "b",
        "c",
    ]
    assert model.longest == 3


def test_the_headline_pairs_the_base_with_the_final_model_on_each_set_and_scoring():
    size = np.array([50, 100, 150, 200])
    right = [True, False] * 20
    scored = Scored()
    for model, factor, flipped in (("base", 1.0, 0), ("warmup", 0.9, 0), ("pretrain", 0.5, 16)):
        nats = factor * np.log(2) * 2.0 * size  # 2 bits per byte, times the factor
        scored.scores[model] = {"heldout": {"documents": 4, "bits_per_byte": 2.0 * factor}}
        scored.documents[model] = {"heldout": (nats, size)}
        # the final model gets 16 of the base's 20 wrong items right
        outcomes = [answer or index < 2 * flipped for index, answer in enumerate(right)]
        scored.tasks[model] = {"source": {"linear probe": Accuracy.of(outcomes, 0.5)}}
    bpb, accuracy = headline(scored, {"heldout": "held-out split"})
    assert bpb["model"] == accuracy["model"] == "pretrain"
    assert (bpb["set"], bpb["title"], bpb["n"], bpb["verdict"]) == (
        "heldout",
        "held-out split",
        4,
        "better",
    )
    assert bpb["base"] == pytest.approx(2.0) and bpb["final"] == pytest.approx(1.0)
    assert bpb["interval_95"] == [pytest.approx(-1.0), pytest.approx(-1.0)]  # every document halved
    assert (accuracy["task"], accuracy["scoring"], accuracy["n"]) == ("source", "linear probe", 40)
    assert accuracy["base"] == 0.5 and accuracy["final"] == 0.9 and accuracy["verdict"] == "better"
    assert accuracy["interval_95"][0] <= 0.4 <= accuracy["interval_95"][1]
    # Without pretrain the final model is warmup; without a base there is nothing to compare.
    assert final_model(["base", "warmup"]) == "warmup" and final_model(["base"]) is None
    del scored.scores["base"]
    assert headline(scored, {"heldout": "held-out split"}) == []
