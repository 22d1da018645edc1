"""Downstream tasks scored by a model with its own tokenizer, and their accuracies with 95% Wilson
intervals, by lm-evaluation-harness' definitions (lm_eval/api/task.py, `process_results` of a
multiple_choice task; lm_eval/api/model.py, how a context and a continuation become tokens).

- Multiple choice: each choice's log-likelihood after the prompt and the target delimiter (a space),
  the choice chosen four ways: `acc` (the highest log-likelihood), `acc_norm` (the highest per
  character of the choice, the delimiter left out), `acc_bytes` (per UTF-8 byte of the choice: the
  two differ outside ASCII) and `acc_mutual_info` (the highest gain over the choice after an empty
  prompt: what the prompt adds, each choice's own frequency taken out; not where the prompt is
  empty, as in XNLI).
- Classification (sib200), two ways: `linear_probe_acc`, a linear probe (multinomial logistic
  regression on the mean of the last hidden states over the text's tokens, fitted on train + dev,
  scored on test), and k-shot prompting, each label a choice after `<k examples><text>\nCategory:`,
  the examples being `<text>\nCategory: <label>` each followed by a blank line (the harness'
  few-shot delimiter), chosen the four ways above.

Every sequence starts with the token the model saw before documents (as in bits_per_byte.py), which
stands where lm-evaluation-harness puts its prefix token; one longer than the window loses the start
of its context, never its answer. Sequences go through the model `batch_size` at a time, longest
first; the logits are computed only where an answer is scored.

The metrics take the log-likelihoods from a function of the (context, continuation) pairs
(`score_questions`), and the tokens of a pair come from a pure function of a tokenizer's `encode`
(`scored_sequences`): stage=evaluate scores an exported model with `continuation_log_likelihoods`, and
the training stages score the same pairs, tokenized the same way, through their engine
(pipeline/training/inloop_tasks.py).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from pipeline.evaluation.standard_tasks import FEWSHOT_DELIMITER, TARGET_DELIMITER, Question
from pipeline.evaluation.task_files import Classification, Task

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
LABEL_PROMPT = "\nCategory:"
ACC, ACC_NORM, ACC_BYTES, ACC_MUTUAL_INFO = "acc", "acc_norm", "acc_bytes", "acc_mutual_info"
LINEAR_PROBE = "linear_probe_acc"
# Texts -> the token ids of each, without special tokens.
Encode = Callable[[list[str]], list[list[int]]]
# (context, continuation) pairs -> log p(continuation | start token + context) of each, in nats.
LogLikelihoods = Callable[[Sequence[tuple[str, str]]], list[float]]


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default): honest near 0 and 1 and for small
    n."""
    if n == 0:
        return 0.0, 1.0
    share = correct / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Accuracy:
    correct: int
    n: int
    chance: float
    # One per test item, in the task's order: whether the chosen answer was right (for paired
    # comparisons of two models on the same items).
    outcomes: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.outcomes) != self.n or sum(self.outcomes) != self.correct:
            raise ValueError(
                f"Accuracy: {self.correct} of {self.n} right, but the outcomes count "
                f"{sum(self.outcomes)} of {len(self.outcomes)}"
            )

    @classmethod
    def of(cls, outcomes: Sequence[bool], chance: float) -> Accuracy:
        outcomes = tuple(bool(outcome) for outcome in outcomes)
        return cls(sum(outcomes), len(outcomes), chance, outcomes)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    def as_dict(self) -> dict:
        low, high = wilson_interval(self.correct, self.n)
        return {
            "accuracy": self.accuracy,
            "interval_95": [low, high],
            "chance": self.chance,
            "correct": self.correct,
            "n": self.n,
        }


@dataclass(frozen=True)
class ScoringModel:
    """A model, its own tokenizer and how it reads text: what every scoring needs."""

    model: torch.nn.Module  # pipeline.model.transformer.Transformer: hidden_states() and head
    tokenizer: object
    start_id: int
    seq_len: int
    batch_size: int
    device: torch.device

    def encode(self, texts: list[str]) -> list[list[int]]:
        return encode_texts(self.tokenizer, texts)


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """The token ids of each text as every scoring reads them: no special tokens added."""
    return [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _batches(sequences: list[list[int]], batch_size: int, device: torch.device):
    """(indices, padded inputs, lengths) of the sequences, longest first, `batch_size` at a time."""
    order = sorted(range(len(sequences)), key=lambda index: -len(sequences[index]))
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        longest = len(sequences[chosen[0]])
        # Padding comes after each sequence: causal attention keeps it out of every position that
        # counts.
        inputs = torch.zeros((len(chosen), longest), dtype=torch.int64)
        for row, index in enumerate(chosen):
            inputs[row, : len(sequences[index])] = torch.tensor(sequences[index])
        yield chosen, inputs.to(device), [len(sequences[index]) for index in chosen]


def encode_pairs(
    encode: Encode, pairs: Sequence[tuple[str, str]]
) -> list[tuple[list[int], list[int]]]:
    """The (context, continuation) token ids of each pair as lm-evaluation-harness splits them: the
    context's trailing spaces move to the continuation; the context and the whole text are
    tokenized, and the continuation is what the whole has beyond the context's tokens. An empty
    context gives the continuation tokenized alone; so does a whole text that the context's tokens
    cover entirely (a word cut in two merged back into one token)."""
    moved = []
    for context, continuation in pairs:
        kept = context.rstrip()
        moved.append((kept, context[len(kept) :] + continuation))
    contexts = encode([context for context, _ in moved])
    wholes = encode([context + continuation for context, continuation in moved])
    encoded = [
        (context_ids, whole[len(context_ids) :] if context else [])
        for (context, _), context_ids, whole in zip(moved, contexts, wholes)
    ]
    alone = [index for index, (_, continuation_ids) in enumerate(encoded) if not continuation_ids]
    for index, ids in zip(alone, encode([moved[index][1] for index in alone])):
        encoded[index] = (encoded[index][0], ids)
    return encoded


def scored_sequences(
    encode: Encode, start_id: int, seq_len: int, pairs: Sequence[tuple[str, str]]
) -> list[tuple[list[int], int]]:
    """Each pair as the model reads it: `[start_id, *context, *continuation]` (encode_pairs) cut to
    its last seq_len + 1 tokens, so that a long context loses its start, never the continuation; and
    how many of its last tokens are scored (the continuation's, at most all but the first). The
    inputs are the sequence but its last token, the targets the sequence but its first."""
    sequences = []
    for context, continuation in encode_pairs(encode, pairs):
        whole = [start_id, *context, *continuation][-(seq_len + 1) :]
        sequences.append((whole, min(len(continuation), len(whole) - 1)))
    return sequences


@torch.no_grad()
def continuation_log_likelihoods(
    scorer: ScoringModel, pairs: Sequence[tuple[str, str]]
) -> list[float]:
    """log p(continuation | start token + context) in nats for each (context, continuation), the
    tokens split as lm-evaluation-harness splits them (scored_sequences)."""
    sequences = scored_sequences(scorer.encode, scorer.start_id, scorer.seq_len, pairs)
    inputs_only = [whole[:-1] for whole, _ in sequences]
    result = [0.0] * len(pairs)
    for chosen, inputs, lengths in _batches(inputs_only, scorer.batch_size, scorer.device):
        hidden = scorer.model.hidden_states(inputs)
        for row, index in enumerate(chosen):
            (whole, count), length = sequences[index], lengths[row]
            logits = scorer.model.head(hidden[row, length - count : length]).float()
            targets = torch.tensor(whole[length - count + 1 : length + 1], device=logits.device)
            result[index] = float(F.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).sum())
    return result


@torch.no_grad()
def mean_hidden_states(scorer: ScoringModel, texts: list[str]) -> torch.Tensor:
    """(texts, hidden_size) float32 on the CPU: the mean of the last hidden states over each text's
    tokens (the first seq_len - 1 of them)."""
    sequences = [[scorer.start_id, *ids[: scorer.seq_len - 1]] for ids in scorer.encode(texts)]
    features = torch.zeros((len(texts), scorer.model.cfg.hidden_size), dtype=torch.float32)
    for chosen, inputs, lengths in _batches(sequences, scorer.batch_size, scorer.device):
        hidden = scorer.model.hidden_states(inputs).float()
        for row, index in enumerate(chosen):
            features[index] = hidden[row, 1 : lengths[row]].mean(dim=0).cpu()
    return features


def fit_probe(
    features: torch.Tensor, labels: torch.Tensor, classes: int, steps: int = 200
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Multinomial logistic regression on standardised features, L2-penalised as scikit-learn's
    default (C=1: the summed cross-entropy plus half the squared weights), fitted by full-batch
    L-BFGS in float64 on the CPU. Returns the predicted class of each row of new features."""
    x = features.double()
    mean, scale = x.mean(dim=0), x.std(dim=0).clamp(min=1e-6)
    x = (x - mean) / scale
    weight = torch.zeros((x.shape[1], classes), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe"
    )

    def closure():
        optimiser.zero_grad()
        loss = F.cross_entropy(x @ weight + bias, labels) + 0.5 * (weight**2).sum() / len(x)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimiser.step(closure)
    weight, bias = weight.detach(), bias.detach()
    return lambda new: (((new.double() - mean) / scale) @ weight + bias).argmax(dim=-1)


def shots(task: Classification, item: int) -> list:
    """The k training examples shown before test item `item`: drawn without replacement, the same on
    every run."""
    return random.Random(item).sample(task.train, min(task.k, len(task.train)))


def prompt(task: Classification, item: int) -> str:
    examples = "".join(
        f"{example.text}{LABEL_PROMPT}{TARGET_DELIMITER}{example.label}{FEWSHOT_DELIMITER}"
        for example in shots(task, item)
    )
    return f"{examples}{task.test[item].text}{LABEL_PROMPT}"


def _best(values: Sequence[float]) -> int:
    """The index of the highest value, the first of equals (numpy's argmax, as the harness takes)."""
    return max(range(len(values)), key=values.__getitem__)


def _chosen(
    log_likelihoods: Sequence[float],
    chars: Sequence[int],
    utf8_bytes: Sequence[int],
    unconditional: Optional[Sequence[float]],
) -> dict[str, int]:
    chosen = {
        ACC: _best(log_likelihoods),
        ACC_NORM: _best([ll / n for ll, n in zip(log_likelihoods, chars)]),
        ACC_BYTES: _best([ll / n for ll, n in zip(log_likelihoods, utf8_bytes)]),
    }
    if unconditional is not None:
        chosen[ACC_MUTUAL_INFO] = _best([ll - u for ll, u in zip(log_likelihoods, unconditional)])
    return chosen


def chosen_choices(
    log_likelihoods: Sequence[float],
    choices: Sequence[str],
    unconditional: Optional[Sequence[float]] = None,
) -> dict[str, int]:
    """The index of the choice each metric picks, from each choice's log-likelihood after the prompt
    and the target delimiter, and after an empty prompt (`unconditional`, for acc_mutual_info)."""
    return _chosen(
        log_likelihoods,
        [len(choice) for choice in choices],
        [len(choice.encode("utf-8")) for choice in choices],
        unconditional,
    )


@dataclass(frozen=True)
class ChoiceLayout:
    """Multiple-choice questions in numbers only: what their metrics need besides the
    log-likelihoods (what the training ranks read back from their task rows)."""

    offsets: tuple[int, ...]  # question q's choices are the pairs offsets[q] : offsets[q + 1]
    correct: tuple[int, ...]  # each question's right choice
    chars: tuple[int, ...]  # each choice's characters (acc_norm) and UTF-8 bytes (acc_bytes)
    utf8_bytes: tuple[int, ...]
    # Each choice's continuation among the pairs with an empty prompt (acc_mutual_info); None where a
    # prompt is empty (XNLI): then there is no such metric.
    prior: Optional[tuple[int, ...]]


def choice_pairs(
    questions: Sequence[Question],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], ChoiceLayout]:
    """What scoring `questions` takes: each choice after its prompt and the target delimiter, as a
    (context, continuation) pair, question by question; when every prompt has text, each distinct
    continuation after an empty prompt (for acc_mutual_info; else none); and their layout."""
    pairs = [
        (question.context, f"{TARGET_DELIMITER}{choice}")
        for question in questions
        for choice in question.choices
    ]
    alone, prior = [], None
    if all(question.context for question in questions):
        # Each distinct choice once: prompting's labels are a few, repeated for every item.
        distinct = list(dict.fromkeys(continuation for _, continuation in pairs))
        place = {continuation: index for index, continuation in enumerate(distinct)}
        alone = [("", continuation) for continuation in distinct]
        prior = tuple(place[continuation] for _, continuation in pairs)
    choices = [choice for question in questions for choice in question.choices]
    layout = ChoiceLayout(
        tuple(itertools.accumulate((len(question.choices) for question in questions), initial=0)),
        tuple(question.correct for question in questions),
        tuple(len(choice) for choice in choices),
        tuple(len(choice.encode("utf-8")) for choice in choices),
        prior,
    )
    return pairs, alone, layout


def accuracies(
    layout: ChoiceLayout, likelihoods: Sequence[float], unconditional: Sequence[float]
) -> dict[str, Accuracy]:
    """The multiple-choice metrics from the log-likelihood of each pair and of each pair with an
    empty prompt (choice_pairs' two lists, in their order)."""
    outcomes: dict[str, list[bool]] = {}
    for question, right in enumerate(layout.correct):
        part = slice(layout.offsets[question], layout.offsets[question + 1])
        prior = None if layout.prior is None else [unconditional[i] for i in layout.prior[part]]
        chosen = _chosen(likelihoods[part], layout.chars[part], layout.utf8_bytes[part], prior)
        for metric, index in chosen.items():
            outcomes.setdefault(metric, []).append(index == right)
    chance = 1 / (layout.offsets[1] - layout.offsets[0])
    return {metric: Accuracy.of(right, chance) for metric, right in outcomes.items()}


def score_questions(
    questions: Sequence[Question], log_likelihoods: LogLikelihoods
) -> dict[str, Accuracy]:
    """The multiple-choice metrics over `questions`: each choice scored after its prompt and the
    target delimiter by `log_likelihoods` (stage=evaluate: partial(continuation_log_likelihoods,
    scorer)); acc_mutual_info too when every prompt has text."""
    pairs, alone, layout = choice_pairs(questions)
    likelihoods = log_likelihoods(pairs)
    return accuracies(layout, likelihoods, log_likelihoods(alone) if alone else [])


def prompted_questions(task: Classification) -> list[Question]:
    """The classification task's test items as k-shot prompts, each label a choice."""
    index = {label: number for number, label in enumerate(task.labels)}
    return [
        Question(prompt(task, item), task.labels, index[example.label])
        for item, example in enumerate(task.test)
    ]


def task_questions(task: Task) -> Sequence[Question]:
    """The questions a task is scored on by log-likelihood: its own (multiple choice), or its test
    items prompted (classification; the linear probe is stage=evaluate's only)."""
    if isinstance(task, Classification):
        return prompted_questions(task)
    return task.questions


def score_classification(scorer: ScoringModel, task: Classification) -> dict[str, Accuracy]:
    index = {label: number for number, label in enumerate(task.labels)}
    known = [*task.train, *task.dev]
    predict = fit_probe(
        mean_hidden_states(scorer, [example.text for example in known]),
        torch.tensor([index[example.label] for example in known]),
        len(task.labels),
    )
    truth = [index[example.label] for example in task.test]
    probed = predict(mean_hidden_states(scorer, [example.text for example in task.test])).tolist()
    return {
        LINEAR_PROBE: Accuracy.of(
            [guess == right for guess, right in zip(probed, truth)], 1 / len(task.labels)
        ),
        **score_questions(prompted_questions(task), partial(continuation_log_likelihoods, scorer)),
    }


def score_task(scorer: ScoringModel, task: Task) -> dict[str, Accuracy]:
    if isinstance(task, Classification):
        return score_classification(scorer, task)
    return score_questions(task.questions, partial(continuation_log_likelihoods, scorer))
