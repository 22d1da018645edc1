"""Downstream tasks scored by a model with its own tokenizer, and their accuracies with 95% Wilson
intervals.

- Multiple choice (belebele): each answer's log-likelihood after the passage and the question (the
  answer after a new line; without a question, after a space, continuing the passage); the answer
  with the highest log-likelihood, the one with the highest log-likelihood per UTF-8 byte of the
  answer (lm-evaluation-harness' acc_norm), and the one that the passage and question make most
  likely compared with no context at all (the log-likelihood gain over the answer after the start
  token alone, lm-evaluation-harness' acc_mutual_info): what the context is worth, with each
  answer's own frequency taken out, the scoring where a small model shows what it reads.
- Classification (sib200), two ways: a linear probe (multinomial logistic regression on the mean of
  the last hidden states over the text's tokens, fitted on train + dev, scored on test), and k-shot
  prompting (k training examples `<text>\\nCategory: <label>` before `<test text>\\nCategory:`, each
  label an answer after a space, chosen the three ways above: a short label is likely whatever the
  text, which the gain over no context takes out).

Every sequence starts with the token the model saw before documents (as in bits_per_byte.py); one
longer than the window loses the start of its context, never its answer. Sequences go through the
model `batch_size` at a time, longest first; the logits are computed only where an answer is scored.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from pipeline.evaluation.task_files import Classification, MultipleChoice, Task

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
LABEL_PROMPT = "\nCategory:"
PROBE = "linear probe"
LOG_LIKELIHOOD, PER_BYTE, CONTEXT_GAIN = (
    "log-likelihood",
    "log-likelihood per byte",
    "gain over no context",
)


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


@torch.no_grad()
def continuation_log_likelihoods(scorer: ScoringModel, pairs: list[tuple[str, str]]) -> list[float]:
    """log p(continuation | start token + context) in nats for each (context, continuation); the two
    are tokenized apart, so that the continuation's tokens are the same after every context."""
    contexts = scorer.encode([context for context, _ in pairs])
    continuations = scorer.encode([continuation for _, continuation in pairs])
    sequences, scored = [], []
    for context, continuation in zip(contexts, continuations):
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
        f"{example.text}{LABEL_PROMPT} {example.label}\n\n" for example in shots(task, item)
    )
    return f"{examples}{task.test[item].text}{LABEL_PROMPT}"


def _best(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _choices(
    scorer: ScoringModel,
    contexts: list[str],
    answers: list[tuple[str, ...]],
    correct: list[int],
    separators: list[str],
    prefix: str = "",
) -> dict[str, Accuracy]:
    """The three multiple-choice scorings of questions given as contexts, their answers (each after
    its separator) and the right answers' indices."""
    pairs = [
        (context, f"{separator}{answer}")
        for context, options, separator in zip(contexts, answers, separators)
        for answer in options
    ]
    likelihoods = continuation_log_likelihoods(scorer, pairs)
    answers_alone = list(
        dict.fromkeys(answer for _, answer in pairs)
    )  # prompting's labels: a few, often repeated
    priors = dict(
        zip(
            answers_alone,
            continuation_log_likelihoods(scorer, [("", answer) for answer in answers_alone]),
        )
    )
    alone = [priors[answer] for _, answer in pairs]
    raw = per_byte = gain = start = 0
    for options, right in zip(answers, correct):
        part = slice(start, start + len(options))
        start += len(options)
        values = likelihoods[part]
        raw += _best(values) == right
        per_byte += (
            _best([value / len(answer.encode("utf-8")) for value, answer in zip(values, options)])
            == right
        )
        gain += _best([value - prior for value, prior in zip(values, alone[part])]) == right
    n, chance = len(correct), 1 / len(answers[0])
    return {
        f"{prefix}{LOG_LIKELIHOOD}": Accuracy(raw, n, chance),
        f"{prefix}{PER_BYTE}": Accuracy(per_byte, n, chance),
        f"{prefix}{CONTEXT_GAIN}": Accuracy(gain, n, chance),
    }


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
    prompts = [prompt(task, item) for item in range(len(task.test))]
    prompted = _choices(
        scorer,
        prompts,
        [task.labels] * len(truth),
        truth,
        [" "] * len(truth),
        prefix=f"{task.k}-shot ",
    )
    return {
        PROBE: Accuracy(
            sum(p == t for p, t in zip(probed, truth)), len(truth), 1 / len(task.labels)
        ),
        **prompted,
    }


def score_multiple_choice(scorer: ScoringModel, task: MultipleChoice) -> dict[str, Accuracy]:
    """Each answer after the passage, a new line, the question and a new line; without a question,
    after the passage and a space."""
    questions = task.questions
    return _choices(
        scorer,
        [f"{q.passage}\n{q.question}" if q.question else q.passage for q in questions],
        [q.answers for q in questions],
        [q.correct for q in questions],
        ["\n" if q.question else " " for q in questions],
    )


def score_task(scorer: ScoringModel, task: Task) -> dict[str, Accuracy]:
    if isinstance(task, Classification):
        return score_classification(scorer, task)
    return score_multiple_choice(scorer, task)
