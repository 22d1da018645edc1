"""The base model's BPE tokenizer extended with tokens for the language
(`tokenizer.extend_base=true`).

The base's vocabulary and merges stay as they are, so every base token keeps its id (and the warm
start copies its embedding row); the new merges come after the base's. BPE applies the lowest-ranked
merge first and no base merge involves a new token, so a word is first cut into the base's tokens
and then the new merges join them: the base's language, which the new merges rarely touch, is cut as
the base cut it, and its rows stay the trained ones. Where an added token would cut the base's
language after all, `Spared` leaves it out (`tokenizer.spare_ratio`): SmolLM2-135M extended by
16,384 Norwegian tokens cut an English book it never read at 50 positions so, at 269 with its merges
learnt on English too and nothing left out.

The new merges are learnt on the base's own segmentation of the training sample, so they are the
ones that fire on it: each base token is written as one character (from U+10000 on, where no
whitespace is), each distinct pre-token of the sample as the characters of its base tokens, and the
`tokenizers` BPE trainer merges those characters, fed each such word as often as the sample has it
(the trainer counts words, so what it learns depends on the counts alone); a merge of two
characters is a merge of the two tokens they spell.

Cutting text into the base's pre-tokens is Python-bound: `base_cuts` and `pieces` do it in batches
on `workers` processes (workers.py), each batch counting its own, and add the counts up in order.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from pipeline.progress import Progress
from pipeline.tokenization.folder import TrainingError
from pipeline.tokenization.workers import batches, in_order

# Token id i is written as chr(FIRST_CODE_POINT + i): every code point from here on is a character
# that no normaliser or whitespace split of the trainer touches.
FIRST_CODE_POINT = 0x10000
MAX_BASE_TOKENS = sys.maxunicode + 1 - FIRST_CODE_POINT


def _normalized(base: Tokenizer, text: str) -> str:
    return base.normalizer.normalize_str(text) if base.normalizer is not None else text


def _pre_tokens(base: Tokenizer, text: str) -> list[str]:
    """The base's pre-tokens of `text` (normalised)."""
    if base.pre_tokenizer is None:
        return [text]
    return [piece for piece, _ in base.pre_tokenizer.pre_tokenize_str(text)]


def _spelled_words(base: Tokenizer, documents: list[str]) -> Counter:
    """The pre-tokens of `documents` as the base cuts them, each written as the characters of its
    base token ids, with their counts: each distinct pre-token is cut once."""
    counts: Counter = Counter()
    for document in documents:
        counts.update(_pre_tokens(base, _normalized(base, document)))
    model, spelled = base.model, Counter()
    for piece, count in counts.items():
        word = "".join(chr(FIRST_CODE_POINT + token.id) for token in model.tokenize(piece))
        spelled[word] += count  # added up: a base with an unknown token may spell two alike
    return spelled


def base_cuts(
    base: Tokenizer, documents: Iterable[str], workers: int, progress: Progress
) -> Counter:
    """Each pre-token of `documents` as the base cuts it (its base token ids as characters), with
    its count: what `extend_bpe` learns from."""
    words: Counter = Counter()
    for counted in in_order(partial(_spelled_words, base), batches(documents), workers, progress):
        words.update(counted)
    return words


# Occurrences of a word in one text fed to the trainer: bounds the texts' length.
_REPEATS = 4096


def _occurrences(words: Counter) -> Iterator[str]:
    """Each word as many times as it occurs, separated by spaces, which the trainer counts back."""
    for word, count in words.items():
        for done in range(0, count, _REPEATS):
            yield (word + " ") * min(_REPEATS, count - done)


def _learnt_merges(
    token_of: dict[int, str], words: Counter, merges: int, min_frequency: int
) -> list[tuple[str, str]]:
    """Up to `merges` merges learnt on `words` (`base_cuts`), each as the two tokens it joins, in
    the order the trainer learnt them (most frequent first)."""
    letters = [chr(FIRST_CODE_POINT + token_id) for token_id in token_of]
    trainer_model = Tokenizer(models.BPE())
    trainer_model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=len(letters) + merges,
        min_frequency=min_frequency,
        initial_alphabet=letters,
        show_progress=sys.stderr.isatty(),
    )
    trainer_model.train_from_iterator(_occurrences(words), trainer)

    def spelling(
        word: str,
    ) -> str:  # the base tokens that a trainer's token is written with, joined
        return "".join(token_of[ord(letter) - FIRST_CODE_POINT] for letter in word)

    learnt = json.loads(trainer_model.to_str())["model"]["merges"]
    return [
        tuple(map(spelling, merge.split(" ") if isinstance(merge, str) else merge))
        for merge in learnt
    ]


def _assembled(
    spec: dict, top_id: int, learnt: list[tuple[str, str]], merges: int, left_out: set[str]
) -> tuple[Tokenizer, dict]:
    """The base (`spec`, ids up to `top_id`) with the first `merges` learnt merges that neither
    build a token of `left_out` nor need one (directly or through another merge left out), and their
    summary."""
    model = spec["model"]
    vocab, kept = dict(model["vocab"]), list(model["merges"])
    as_text = bool(kept) and isinstance(
        kept[0], str
    )  # "a b" from tokenizers < 0.20, ["a", "b"] since
    existing = appended = 0
    for left, right in learnt:
        if appended == merges:
            break
        token = left + right
        if token in left_out or left not in vocab or right not in vocab:
            continue
        if token in vocab:
            existing += 1
        else:
            top_id += 1
            vocab[token] = top_id
        kept.append(f"{left} {right}" if as_text else [left, right])
        appended += 1
    extended = {**spec, "model": {**model, "vocab": vocab, "merges": kept}}
    summary = {"merges": appended, "added_tokens": appended - existing, "existing": existing}
    return Tokenizer.from_str(json.dumps(extended, ensure_ascii=False)), summary


@dataclass
class Pieces:
    """Texts as the base's BPE model meets them: each distinct pre-token (normalised and split as
    the base does) with its count, so that a round of `extend_bpe` cuts each once instead of at
    every occurrence (encoding the whole texts in every round took 90 s of the stage's 110 in
    tests/stages: 17 rounds of 5 MB, 70,000 distinct pre-tokens), and, whole, the texts that hold an
    added token's content, which `encode` splits off before normalising: those are encoded as they
    are. `bytes`: UTF-8 bytes of all the texts."""

    counts: Counter = field(default_factory=Counter)
    whole: list[str] = field(default_factory=list)
    bytes: int = 0

    def add(self, other: "Pieces") -> None:
        self.counts.update(other.counts)
        self.whole += other.whole
        self.bytes += other.bytes


def _counted_pieces(base: Tokenizer, texts: list[str]) -> Pieces:
    contents = [added.content for added in base.get_added_tokens_decoder().values()]
    counted = Pieces()
    for text in texts:
        counted.bytes += len(text.encode("utf-8"))
        normalized = _normalized(base, text)
        if any(content in text or content in normalized for content in contents):
            counted.whole.append(text)
        else:
            counted.counts.update(_pre_tokens(base, normalized))
    return counted


def pieces(base: Tokenizer, texts: Iterable[str], workers: int, progress: Progress) -> Pieces:
    """`texts` as `Pieces`, for `Spared`."""
    counted = Pieces()
    for part in in_order(partial(_counted_pieces, base), batches(texts), workers, progress):
        counted.add(part)
    return counted


@dataclass
class Spared:
    """Text that the added tokens should leave as the base cuts it (the base's own language), and
    some of the target's, as `pieces`: an added token is left out where `text` uses it at least
    `ratio` times as often per byte as `target`."""

    text: Pieces
    target: Pieces
    ratio: float


def _uses(tokenizer: Tokenizer, first_added: int, counted: Pieces) -> Counter:
    """How often each added token (ids from `first_added`) cuts the texts `counted`, which
    `tokenizer` (the base extended: its normaliser, pre-tokenizer and added tokens) cuts as `encode`
    would."""
    uses: Counter = Counter()
    # The model alone: each distinct pre-token cut whole, as `encode` cuts each of its occurrences.
    model = Tokenizer(tokenizer.model)
    distinct = list(counted.counts)
    for start in range(0, len(distinct), 8192):
        chunk = distinct[start : start + 8192]
        for piece, encoding in zip(chunk, model.encode_batch(chunk, add_special_tokens=False)):
            for token_id in encoding.ids:
                if token_id >= first_added:
                    uses[token_id] += counted.counts[piece]
    for start in range(0, len(counted.whole), 1024):
        for encoding in tokenizer.encode_batch(
            counted.whole[start : start + 1024], add_special_tokens=False
        ):
            uses.update(token_id for token_id in encoding.ids if token_id >= first_added)
    return uses


def _used_elsewhere(tokenizer: Tokenizer, first_added: int, spared: Spared) -> set[str]:
    """The added tokens that the spared text uses too often against the target's."""
    elsewhere, target = (
        _uses(tokenizer, first_added, text) for text in (spared.text, spared.target)
    )
    return {
        tokenizer.id_to_token(token_id)
        for token_id, count in elsewhere.items()
        if count * spared.target.bytes >= spared.ratio * target[token_id] * spared.text.bytes
    }


def check_extendable(base: Tokenizer) -> None:
    """Raises TrainingError for a base that `extend_bpe` cannot extend: one that is not BPE, or has
    more ids than there are characters to spell them."""
    _extendable_spec(base)


def _extendable_spec(base: Tokenizer) -> tuple[dict, int]:
    """The base's tokenizer.json as a dict and its highest id, once `check_extendable`'s checks
    pass."""
    spec = json.loads(base.to_str())
    if spec["model"]["type"] != "BPE":
        raise TrainingError(
            "tokenizer.extend_base=true adds BPE merges, but the base tokenizer is "
            f"{spec['model']['type']}."
        )
    top_id = _top_id(spec)
    if top_id >= MAX_BASE_TOKENS:
        raise TrainingError(
            f"the base tokenizer has ids up to {top_id:,}; extending it handles up to "
            f"{MAX_BASE_TOKENS - 1:,}."
        )
    return spec, top_id


def _top_id(spec: dict) -> int:
    return max(
        [*spec["model"]["vocab"].values(), *(added["id"] for added in spec.get("added_tokens", []))]
    )


def extend_bpe(
    base: Tokenizer,
    words: Counter,
    added_tokens: int,
    min_frequency: int,
    spared: Spared | None = None,
) -> tuple[Tokenizer, dict]:
    """The base tokenizer with up to `added_tokens` new merges learnt on `words` (`base_cuts` of the
    training text), and what was added: {"base_tokens", "merges", "added_tokens", "existing",
    "left_out"} (`existing`: merges whose token the base already had, though its own merges never
    build it that way).

    With `spared`, an added token used too often in its text is left out (`left_out` counts them),
    and so are the merges that need it; later learnt merges take their places (a quarter more are
    learnt, and more again if that is not enough). Raises TrainingError for a base that
    `check_extendable` refuses."""
    spec, top_id = _extendable_spec(base)
    token_of = {token_id: token for token, token_id in spec["model"]["vocab"].items()}
    extra, left_out = (added_tokens // 4 if spared else 0), set()
    learnt = _learnt_merges(token_of, words, added_tokens + extra, min_frequency)
    # ends: each round leaves out more of the learnt tokens or learns more merges, of finitely many
    while True:
        extended, summary = _assembled(spec, top_id, learnt, added_tokens, left_out)
        used = _used_elsewhere(extended, top_id + 1, spared) if spared else set()
        if used:
            left_out |= used
        elif (
            summary["merges"] < added_tokens and len(learnt) == added_tokens + extra
        ):  # the text has more merges
            extra += 2 * len(left_out)
            learnt = _learnt_merges(token_of, words, added_tokens + extra, min_frequency)
        else:
            return extended, {
                "base_tokens": base.get_vocab_size(),
                **summary,
                "left_out": len(left_out),
            }
