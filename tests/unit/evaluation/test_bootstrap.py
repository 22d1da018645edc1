"""The evaluate stage's uncertainty: bootstrap intervals of bits per byte over documents, paired
comparisons of two models on the same documents or test items, and the per-document sums that
scoring keeps for them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.evaluation.bits_per_byte import score_documents, scoring_rows
from pipeline.evaluation.uncertainty import (
    BETTER,
    NOT_TOLD_APART,
    WORSE,
    accuracy_change,
    bits_per_byte_change,
    bits_per_byte_interval,
    resampled_sums,
    verdict,
)
from pipeline.model.files import load_base
from pipeline.tokenization.folder import load_tokenizer, token_roles

LN2 = math.log(2)


def _documents(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bits per byte, nats, bytes) of `count` documents of a few hundred to a few thousand bytes,
    each with its own bits per byte around 1.5."""
    generator = np.random.default_rng(seed)
    size = np.round(generator.lognormal(7, 0.8, count)).astype(np.int64) + 1
    bpb = generator.normal(1.5, 0.3, count).clip(0.3)
    return bpb, bpb * size * LN2, size


def _ratio(nats: np.ndarray, size: np.ndarray) -> float:
    return float(nats.sum() / size.sum() / LN2)


def test_the_interval_holds_the_estimate_and_narrows_with_more_documents():
    widths = {}
    for count in (20, 2000):
        _, nats, size = _documents(count)
        low, high = bits_per_byte_interval(nats, size)
        assert low < _ratio(nats, size) < high
        assert 1.0 < low and high < 2.0  # around the documents' 1.5
        widths[count] = high - low
    # A hundred times the documents: about a tenth of the width (the square root).
    assert 0.05 < widths[2000] / widths[20] < 0.2, widths


def test_resampling_is_the_same_for_every_column_and_every_run():
    values = np.arange(50.0)
    first, second = resampled_sums([values, values])
    assert np.array_equal(first, second)  # the same documents for both columns: pairing
    assert np.array_equal(resampled_sums([values])[0], first)  # the same seed: the same resamples
    assert first.shape == (1000,) and first.mean() == pytest.approx(values.sum(), rel=0.02)
    # drawn in chunks (a large set): the same statistics, every chunk filled
    chunked = resampled_sums([np.ones(10**5)], resamples=120)
    assert np.all(chunked == 10**5)


def test_verdicts_follow_the_direction_that_is_better():
    assert verdict(-0.3, -0.1, lower_is_better=True) == BETTER
    assert verdict(0.1, 0.3, lower_is_better=True) == WORSE
    assert verdict(0.1, 0.3, lower_is_better=False) == BETTER
    assert verdict(-0.3, -0.1, lower_is_better=False) == WORSE
    assert verdict(-0.1, 0.1, lower_is_better=True) == NOT_TOLD_APART
    assert verdict(0.0, 0.0, lower_is_better=False) == NOT_TOLD_APART


def test_a_paired_change_in_bits_per_byte_is_told_apart_where_it_is_real():
    bpb, nats, size = _documents(60)
    base_estimate = _ratio(nats, size)
    # 5% fewer bits on every document: better, though the two models' own intervals overlap.
    better = bits_per_byte_change(nats, size, 0.95 * nats, size)
    assert better.verdict == BETTER and better.interval_95[1] < 0
    assert better.base == pytest.approx(base_estimate) and better.change == pytest.approx(
        -0.05 * base_estimate
    )
    assert better.interval_95[0] < better.change < better.interval_95[1]
    alone = [bits_per_byte_interval(n, size) for n in (nats, 0.95 * nats)]
    assert alone[1][1] > alone[0][0]  # side by side they overlap: only pairing tells them apart
    worse = bits_per_byte_change(nats, size, 1.05 * nats, size)
    assert worse.verdict == WORSE and worse.interval_95[0] > 0
    # Noise: half the documents 0.3 bits per byte better, the other half (the same bytes) worse.
    twins = np.concatenate([size, size])
    base_twins = np.concatenate([nats, nats])
    shift = 0.3 * LN2 * twins * np.repeat([1, -1], len(size))
    noise = bits_per_byte_change(base_twins, twins, base_twins + shift, twins)
    assert noise.change == pytest.approx(0, abs=1e-12) and noise.verdict == NOT_TOLD_APART
    assert noise.interval_95[0] < 0 < noise.interval_95[1]
    with pytest.raises(ValueError, match="the same documents"):
        bits_per_byte_change(nats, size, nats[:-1], size[:-1])


def test_a_paired_change_in_accuracy_over_test_items():
    generator = np.random.default_rng(3)
    base = generator.random(200) < 0.4
    clearly_better = base | (generator.random(200) < 0.5)  # every right answer kept, more added
    change = accuracy_change(base.tolist(), clearly_better.tolist())
    assert change.verdict == BETTER and change.base == pytest.approx(base.mean())
    assert change.interval_95[0] <= change.change <= change.interval_95[1]
    assert accuracy_change(clearly_better.tolist(), base.tolist()).verdict == WORSE
    # The same answers: no change, an interval of nothing either way.
    same = accuracy_change(base.tolist(), base.tolist())
    assert same.change == 0 and same.interval_95 == (0.0, 0.0) and same.verdict == NOT_TOLD_APART
    # As many items gained as lost: noise.
    swapped = base.copy()
    right, wrong = np.flatnonzero(base)[:20], np.flatnonzero(~base)[:20]
    swapped[right], swapped[wrong] = False, True
    noise = accuracy_change(base.tolist(), swapped.tolist())
    assert noise.change == 0 and noise.verdict == NOT_TOLD_APART
    assert noise.interval_95[0] < 0 < noise.interval_95[1]
    assert noise.as_dict() == {
        "base": noise.base,
        "final": noise.final,
        "change": 0.0,
        "interval_95": list(noise.interval_95),
        "verdict": NOT_TOLD_APART,
    }


def test_scoring_keeps_each_documents_nats_and_bytes(english_base):
    """Windows that cut documents across rows: each document's sum is its own score alone."""
    model, tokenizer = load_base(str(english_base)).eval(), load_tokenizer(str(english_base))
    start_id = token_roles(english_base, tokenizer)["eos"]
    texts = [
        "The cat sat on the mat, and the dog lay by the door all afternoon.",
        "",
        "Rain fell over the town; people hurried home with their collars up.",
        "A short one.",
    ]
    cpu = torch.device("cpu")
    score = score_documents(model, tokenizer, texts, start_id, 8, 4, 3, cpu)
    assert score.documents == 3 and len(score.document_nats) == len(texts)
    assert score.document_bytes.tolist() == [len(text.encode("utf-8")) for text in texts]
    assert score.nats == float(np.sum(score.document_nats))  # the very total the report shows
    for text, nats in zip(texts, score.document_nats):
        alone = (
            score_documents(model, tokenizer, [text], start_id, 8, 4, 3, cpu).nats if text else 0
        )
        assert nats == pytest.approx(alone, rel=1e-5)
    rows = scoring_rows(texts, tokenizer, start_id, 8, 4)
    assert set(np.unique(rows.document_ids)) == {-1, 0, 2, 3}
    padded = rows.padded_to(len(rows) + 1)
    assert (
        padded.document_ids.shape == padded.inputs.shape and (padded.document_ids[-1] == -1).all()
    )
