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
whitespace is), each pre-token of the sample as the characters of its base tokens, and the
`tokenizers` BPE trainer merges those characters; a merge of two characters is a merge of the two
tokens they spell.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from pipeline.tokenization.folder import TrainingError

# Token id i is written as chr(FIRST_CODE_POINT + i): every code point from here on is a character
# that no normaliser or whitespace split of the trainer touches.
FIRST_CODE_POINT = 0x10000
MAX_BASE_TOKENS = sys.maxunicode + 1 - FIRST_CODE_POINT


def _spelled_documents(base: Tokenizer, documents: Iterable[str]) -> Iterator[str]:
    """Each document as the base cuts it: its pre-tokens, each the characters of its base token ids,
    joined by spaces (the trainer's word boundaries)."""
    spelled: dict[str, str] = {}  # a pre-token's spelling, once per distinct pre-token
    for document in documents:
        text = base.normalizer.normalize_str(document) if base.normalizer is not None else document
        pieces = (
            base.pre_tokenizer.pre_tokenize_str(text)
            if base.pre_tokenizer is not None
            else [(text, None)]
        )
        words = []
        for piece, _ in pieces:
            word = spelled.get(piece)
            if word is None:
                word = spelled[piece] = "".join(
                    chr(FIRST_CODE_POINT + token.id) for token in base.model.tokenize(piece)
                )
            words.append(word)
        yield " ".join(words)


def _learnt_merges(
    base: Tokenizer,
    token_of: dict[int, str],
    documents: Iterable[str],
    merges: int,
    min_frequency: int,
) -> list[tuple[str, str]]:
    """Up to `merges` merges learnt on `documents` as the base cuts them, each as the two tokens it
    joins, in the order the trainer learnt them (most frequent first)."""
    letters = [chr(FIRST_CODE_POINT + token_id) for token_id in token_of]
    trainer_model = Tokenizer(models.BPE())
    trainer_model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=len(letters) + merges,
        min_frequency=min_frequency,
        initial_alphabet=letters,
        show_progress=sys.stderr.isatty(),
    )
    trainer_model.train_from_iterator(_spelled_documents(base, documents), trainer)

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
class Spared:
    """Text that the added tokens should leave as the base cuts it (the base's own language), and
    some of the target's: an added token is left out where `texts` use it at least `ratio` times as
    often per byte as `target`."""

    texts: list[str]
    target: list[str]
    ratio: float
    # UTF-8 bytes of `texts` and of `target`.
    bytes: int = field(init=False)
    target_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.bytes, self.target_bytes = (
            sum(len(text.encode("utf-8")) for text in texts) for texts in (self.texts, self.target)
        )


@dataclass
class _Pieces:
    """Texts as the base's BPE model meets them: each distinct pre-token (normalised and split as
    the base does) with its count, so that a round of `extend_bpe` cuts each once instead of at
    every occurrence (encoding the whole texts in every round took 90 s of the stage's 110 in
    tests/stages: 17 rounds of 5 MB, 70,000 distinct pre-tokens), and, whole, the texts that hold an
    added token's content, which `encode` splits off before normalising: those are encoded as they
    are."""

    counts: Counter
    whole: list[str]


def _pieces(base: Tokenizer, texts: list[str]) -> _Pieces:
    contents = [added.content for added in base.get_added_tokens_decoder().values()]
    counts: Counter = Counter()
    whole = []
    for text in texts:
        normalized = base.normalizer.normalize_str(text) if base.normalizer is not None else text
        if any(content in text or content in normalized for content in contents):
            whole.append(text)
            continue
        pieces = (
            base.pre_tokenizer.pre_tokenize_str(normalized)
            if base.pre_tokenizer is not None
            else [(normalized, None)]
        )
        counts.update(piece for piece, _ in pieces)
    return _Pieces(counts, whole)


def _uses(tokenizer: Tokenizer, first_added: int, pieces: _Pieces) -> Counter:
    """How often each added token (ids from `first_added`) cuts the texts of `pieces`, which
    `tokenizer` (the base extended: its normaliser, pre-tokenizer and added tokens) cuts as `encode`
    would."""
    uses: Counter = Counter()
    # The model alone: each distinct pre-token cut whole, as `encode` cuts each of its occurrences.
    model = Tokenizer(tokenizer.model)
    distinct = list(pieces.counts)
    for start in range(0, len(distinct), 8192):
        chunk = distinct[start : start + 8192]
        for piece, encoding in zip(chunk, model.encode_batch(chunk, add_special_tokens=False)):
            for token_id in encoding.ids:
                if token_id >= first_added:
                    uses[token_id] += pieces.counts[piece]
    for start in range(0, len(pieces.whole), 1024):
        for encoding in tokenizer.encode_batch(
            pieces.whole[start : start + 1024], add_special_tokens=False
        ):
            uses.update(token_id for token_id in encoding.ids if token_id >= first_added)
    return uses


def _used_elsewhere(
    tokenizer: Tokenizer, first_added: int, spared: Spared, pieces: tuple[_Pieces, _Pieces]
) -> set[str]:
    """The added tokens that the spared text uses too often against the target's (`pieces`: of
    spared's texts and of its target)."""
    elsewhere, target = (_uses(tokenizer, first_added, counted) for counted in pieces)
    return {
        tokenizer.id_to_token(token_id)
        for token_id, count in elsewhere.items()
        if count * spared.target_bytes >= spared.ratio * target[token_id] * spared.bytes
    }


def extend_bpe(
    base: Tokenizer,
    documents: Callable[[], Iterable[str]],
    added_tokens: int,
    min_frequency: int,
    spared: Spared | None = None,
) -> tuple[Tokenizer, dict]:
    """The base tokenizer with up to `added_tokens` new merges learnt on `documents()` (streamed),
    and what was added: {"base_tokens", "merges", "added_tokens", "existing", "left_out"}
    (`existing`: merges whose token the base already had, though its own merges never build it that
    way).

    With `spared`, an added token used too often in its text is left out (`left_out` counts them),
    and so are the merges that need it; later learnt merges take their places (a quarter more are
    learnt, and `documents()` read again for more if that is not enough). Raises TrainingError for a
    base that is not BPE."""
    spec = json.loads(base.to_str())
    model = spec["model"]
    if model["type"] != "BPE":
        raise TrainingError(
            "tokenizer.extend_base=true adds BPE merges, but the base tokenizer is "
            f"{model['type']}."
        )
    token_of = {token_id: token for token, token_id in model["vocab"].items()}
    top_id = max([*token_of, *(added["id"] for added in spec.get("added_tokens", []))])
    if top_id >= MAX_BASE_TOKENS:
        raise TrainingError(
            f"the base tokenizer has ids up to {top_id:,}; extending it handles up to "
            f"{MAX_BASE_TOKENS - 1:,}."
        )
    extra, left_out = (added_tokens // 4 if spared else 0), set()
    learnt = _learnt_merges(base, token_of, documents(), added_tokens + extra, min_frequency)
    # the spared texts pre-tokenized once: every round's extension has the base's normaliser and
    # pre-tokenizer
    pieces = (_pieces(base, spared.texts), _pieces(base, spared.target)) if spared else None
    # ends: each round leaves out more of the learnt tokens or learns more merges, of finitely many
    while True:
        extended, summary = _assembled(spec, top_id, learnt, added_tokens, left_out)
        used = _used_elsewhere(extended, top_id + 1, spared, pieces) if spared else set()
        if used:
            left_out |= used
        elif (
            summary["merges"] < added_tokens and len(learnt) == added_tokens + extra
        ):  # the text has more merges
            extra += 2 * len(left_out)
            learnt = _learnt_merges(
                base, token_of, documents(), added_tokens + extra, min_frequency
            )
        else:
            return extended, {
                "base_tokens": base.get_vocab_size(),
                **summary,
                "left_out": len(left_out),
            }
