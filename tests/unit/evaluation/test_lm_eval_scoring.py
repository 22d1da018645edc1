"""The multiple-choice scorings follow lm-evaluation-harness' definitions (lm_eval/api/task.py,
`process_results` of a multiple_choice task; lm_eval/api/model.py, `_encode_pair`), written out here
and computed both ways: on hand-made log-likelihoods, and on a tiny character model whose
log-likelihoods the test computes itself."""

from __future__ import annotations

import string
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import BPE

from pipeline.evaluation.standard_tasks import Question
from pipeline.evaluation.task_files import Classification, Example
from pipeline.evaluation.task_scoring import (
    ACC,
    ACC_BYTES,
    ACC_MUTUAL_INFO,
    ACC_NORM,
    LINEAR_PROBE,
    Accuracy,
    ScoringModel,
    chosen_choices,
    continuation_log_likelihoods,
    encode_pairs,
    score_questions,
    score_task,
)

START = "<s>"
ALPHABET = [START, " ", "\n", ":", "?", ",", *string.ascii_letters, *"æøå"]


def _argmax(values):
    """numpy's argmax: the first of equals."""
    return max(range(len(values)), key=lambda index: values[index])


def _harness_choices(lls, choices, unconditional=None) -> dict[str, int]:
    """The harness' picks: acc the highest log-likelihood; acc_norm divided by the choice's length
    in characters (`len(choice)` of doc_to_choice, the target delimiter not counted); acc_bytes by
    its UTF-8 bytes; acc_mutual_info the log-likelihood minus the choice's after an empty context."""
    picks = {
        "acc": _argmax(lls),
        "acc_norm": _argmax([ll / float(len(c)) for ll, c in zip(lls, choices)]),
        "acc_bytes": _argmax([ll / float(len(c.encode("utf-8"))) for ll, c in zip(lls, choices)]),
    }
    if unconditional is not None:
        picks["acc_mutual_info"] = _argmax([c - u for c, u in zip(lls, unconditional)])
    return picks


def test_the_metric_names_are_the_harness_own():
    assert (ACC, ACC_NORM, ACC_BYTES, ACC_MUTUAL_INFO) == (
        "acc",
        "acc_norm",
        "acc_bytes",
        "acc_mutual_info",
    )


@pytest.mark.parametrize(
    "lls, choices, unconditional",
    [
        ([-4.0, -3.0, -9.0, -3.5], ("A", "B", "C", "D"), [-2.0, -1.0, -8.0, -3.4]),
        ([-12.0, -9.0, -20.0], ("a long answer", "short", "the longest answer of all"), None),
        ([-3.0, -3.0], ("tie", "tie"), [-1.0, -1.0]),  # ties go to the first, as numpy's argmax
        ([-6.0, -5.9, -7.0], ("xx", "yyyyyyyy", "z"), [-6.5, -1.0, -3.0]),
    ],
)
def test_picks_match_the_harness_definitions(lls, choices, unconditional):
    assert chosen_choices(lls, choices, unconditional) == _harness_choices(
        lls, choices, unconditional
    )


def test_per_character_and_per_byte_differ_outside_ascii():
    # "ååå": 3 characters, 6 UTF-8 bytes; "abcd": 4 and 4.
    lls, choices = [-6.0, -7.0], ("ååå", "abcd")
    picks = chosen_choices(lls, choices)
    assert picks["acc_norm"] == 1  # -6/3 = -2.0 < -7/4 = -1.75
    assert picks["acc_bytes"] == 0  # -6/6 = -1.0 > -7/4
    assert picks == _harness_choices(lls, choices)
    assert ACC_MUTUAL_INFO not in picks  # no unconditional log-likelihoods given


def test_accuracy_keeps_each_item_outcome():
    accuracy = Accuracy.of([True, False, True, True], 0.25)
    assert (accuracy.correct, accuracy.n, accuracy.outcomes) == (3, 4, (True, False, True, True))
    assert list(accuracy.as_dict()) == ["accuracy", "interval_95", "chance", "correct", "n"]
    with pytest.raises(ValueError, match="outcomes"):
        Accuracy(2, 4, 0.25, (True, False, False, False))


class _RunningMean(torch.nn.Module):
    """A causal model small enough to compute by hand: the hidden state at a position is the mean of
    the embeddings so far, the logits a linear map of it."""

    def __init__(self, vocab: int, width: int = 16):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embedding = torch.nn.Parameter(torch.randn((vocab, width), generator=generator))
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight.data = torch.randn((vocab, width), generator=generator)
        self.cfg = SimpleNamespace(hidden_size=width)

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(1, ids.shape[1] + 1, dtype=torch.float32)[:, None]
        return self.embedding[ids].cumsum(dim=1) / positions


@pytest.fixture(scope="module")
def scorer() -> ScoringModel:
    vocab = {character: index for index, character in enumerate(ALPHABET)}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[]))  # one token per character
    model = _RunningMean(len(vocab)).eval()
    return ScoringModel(model, tokenizer, vocab[START], 64, 3, torch.device("cpu"))


@torch.no_grad()
def _log_likelihood(scorer: ScoringModel, context: str, continuation: str) -> float:
    """The model's log-probability of the continuation's characters after the start token and the
    context, in float64 (one token per character, so the harness' split is the plain one)."""
    vocab = scorer.tokenizer.get_vocab()
    ids = [scorer.start_id, *(vocab[c] for c in context), *(vocab[c] for c in continuation)]
    embedding = scorer.model.embedding.double()
    total = 0.0
    for at in range(len(ids) - len(continuation), len(ids)):
        hidden = embedding[ids[:at]].mean(dim=0)
        log_probs = F.log_softmax(scorer.model.head.weight.double() @ hidden, dim=-1)
        total += float(log_probs[ids[at]])
    return total


QUESTIONS = [
    Question("P: a\nQ: b?\nA: x\nB: y\nAnswer:", ("A", "B"), 1),
    Question("the cat sat on the", ("mat", "æøå", "dog house", "a"), 0),
    Question("abc", ("d", "dd", "ddd"), 2),
    Question("ø:", ("å", "aa"), 1),
]


def test_a_model_scores_as_the_harness_definitions_say(scorer):
    pairs = [(q.context, f" {c}") for q in QUESTIONS for c in q.choices]
    pairs += [("", f" {c}") for q in QUESTIONS for c in q.choices]
    assert continuation_log_likelihoods(scorer, pairs) == pytest.approx(
        [_log_likelihood(scorer, *pair) for pair in pairs], rel=1e-5
    )
    ours = score_questions(QUESTIONS, partial(continuation_log_likelihoods, scorer))
    expected: dict[str, list[bool]] = {}
    for question in QUESTIONS:
        lls = [_log_likelihood(scorer, question.context, f" {c}") for c in question.choices]
        alone = [_log_likelihood(scorer, "", f" {c}") for c in question.choices]
        for metric, pick in _harness_choices(lls, question.choices, alone).items():
            expected.setdefault(metric, []).append(pick == question.correct)
    assert list(ours) == ["acc", "acc_norm", "acc_bytes", "acc_mutual_info"]
    for metric, outcomes in expected.items():
        assert ours[metric].outcomes == tuple(outcomes), metric
        assert ours[metric].correct == sum(outcomes) and ours[metric].n == len(QUESTIONS)
    assert ours["acc"].chance == 0.5


def test_without_a_prompt_there_is_no_mutual_information(scorer):
    # XNLI's items: each choice a whole text after the start token; gain over an empty prompt is 0.
    items = [Question("", ("ab, right? Yes, c", "ab, right? No, c"), 0)]
    assert list(score_questions(items, partial(continuation_log_likelihoods, scorer))) == [
        "acc",
        "acc_norm",
        "acc_bytes",
    ]


def test_the_context_trailing_spaces_go_to_the_continuation(scorer):
    vocab = scorer.tokenizer.get_vocab()
    (context, continuation), (empty, alone) = encode_pairs(
        scorer.encode, [("ab: ", "c"), ("", " c")]
    )
    assert context == [vocab["a"], vocab["b"], vocab[":"]]
    assert continuation == [vocab[" "], vocab["c"]]
    assert (empty, alone) == ([], [vocab[" "], vocab["c"]])


def test_classification_scores_every_test_item(scorer):
    train = tuple(Example(text, label) for text, label in [("abab", "a"), ("cdcd", "b")] * 3)
    test = (Example("abba", "a"), Example("dcdc", "b"), Example("aaab", "a"))
    task = Classification("toy", "nob", "toy", ("a", "b"), train, train[:2], test, k=2)
    results = score_task(scorer, task)
    assert list(results) == [LINEAR_PROBE, "acc", "acc_norm", "acc_bytes", "acc_mutual_info"]
    for accuracy in results.values():
        assert len(accuracy.outcomes) == 3 and accuracy.correct == sum(accuracy.outcomes)
