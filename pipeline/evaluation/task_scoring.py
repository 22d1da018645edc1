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
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from pipeline.evaluation.standard_tasks import FEWSHOT_DELIMITER, TARGET_DELIMITER, Question
from pipeline.evaluation.task_files import Classification, Task

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
LABEL_PROMPT = "\nCategory:"
ACC, ACC_NORM, ACC_BYTES, ACC_MUTUAL_INFO = "acc", "acc_norm", "acc_bytes", "acc_mutual_info"
LINEAR_PROBE = "linear_probe_acc"


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
        return [
            encoding.ids
            for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ]


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
    scorer: ScoringModel, pairs: Sequence[tuple[str, str]]
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
    contexts = scorer.encode([context for context, _ in moved])
    wholes = scorer.encode([context + continuation for context, continuation in moved])
    encoded = [
        (context_ids, whole[len(context_ids) :] if context else [])
        for (context, _), context_ids, whole in zip(moved, contexts, wholes)
    ]
    alone = [index for index, (_, continuation_ids) in enumerate(encoded) if not continuation_ids]
    for index, ids in zip(alone, scorer.encode([moved[index][1] for index in alone])):
        encoded[index] = (encoded[index][0], ids)
    return encoded


@torch.no_grad()
def continuation_log_likelihoods(
    scorer: ScoringModel, pairs: Sequence[tuple[str, str]]
) -> list[float]:
    """log p(continuation | start token + context) in nats for each (context, continuation), the
    tokens split as lm-evaluation-harness splits them (encode_pairs)."""
    sequences, scored = [], []
    for context, continuation in encode_pairs(scorer, pairs):
        whole = [scorer.start_id, *context, *continuation][-(scorer.seq_len + 1) :]
        sequences.append(whole)
        scored.append(min(len(continuation), len(whole) - 1))
    inputs_only = [sequence[:-1] for sequence in sequences]
    result = [0.0] * len(pairs)
    for chosen, inputs, lengths in _batches(inputs_only, scorer.batch_size, scorer.device):
        hidden = scorer.model.hidden_states(inputs)
        for row, index in enumerate(chosen):
            count, length = scored[index], lengths[row]
            logits = scorer.model.head(hidden[row, length - count : length]).float()
            targets = torch.tensor(
                sequences[index][length - count + 1 : length + 1], device=logits.device
            )
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


def chosen_choices(
    log_likelihoods: Sequence[float],
    choices: Sequence[str],
    unconditional: Optional[Sequence[float]] = None,
) -> dict[str, int]:
    """The index of the choice each metric picks, from each choice's log-likelihood after the prompt
    and the target delimiter, and after an empty prompt (`unconditional`, for acc_mutual_info)."""
    chosen = {
        ACC: _best(log_likelihoods),
        ACC_NORM: _best([ll / len(choice) for ll, choice in zip(log_likelihoods, choices)]),
        ACC_BYTES: _best(
            [ll / len(choice.encode("utf-8")) for ll, choice in zip(log_likelihoods, choices)]
        ),
    }
    if unconditional is not None:
        chosen[ACC_MUTUAL_INFO] = _best([ll - u for ll, u in zip(log_likelihoods, unconditional)])
    return chosen


def score_questions(scorer: ScoringModel, questions: Sequence[Question]) -> dict[str, Accuracy]:
    """The multiple-choice metrics over `questions`: each choice scored after its prompt and the
    target delimiter; acc_mutual_info too when every prompt has text."""
    pairs = [
        (question.context, f"{TARGET_DELIMITER}{choice}")
        for question in questions
        for choice in question.choices
    ]
    likelihoods = continuation_log_likelihoods(scorer, pairs)
    unconditional = None
    if all(question.context for question in questions):
        # Each distinct choice once: prompting's labels are a few, repeated for every item.
        alone = list(dict.fromkeys(continuation for _, continuation in pairs))
        prior = dict(
            zip(alone, continuation_log_likelihoods(scorer, [("", text) for text in alone]))
        )
        unconditional = [prior[continuation] for _, continuation in pairs]
    outcomes: dict[str, list[bool]] = {}
    start = 0
    for question in questions:
        part = slice(start, start + len(question.choices))
        start = part.stop
        chosen = chosen_choices(
            likelihoods[part],
            question.choices,
            None if unconditional is None else unconditional[part],
        )
        for metric, index in chosen.items():
            outcomes.setdefault(metric, []).append(index == question.correct)
    chance = 1 / len(questions[0].choices)
    return {metric: Accuracy.of(right, chance) for metric, right in outcomes.items()}


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
    prompted = [
        Question(prompt(task, item), task.labels, right) for item, right in enumerate(truth)
    ]
    return {
        LINEAR_PROBE: Accuracy.of(
            [guess == right for guess, right in zip(probed, truth)], 1 / len(task.labels)
        ),
        **score_questions(scorer, prompted),
    }


def score_task(scorer: ScoringModel, task: Task) -> dict[str, Accuracy]:
    if isinstance(task, Classification):
        return score_classification(scorer, task)
    return score_questions(scorer, task.questions)
