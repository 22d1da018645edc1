"""The base model's BPE tokenizer extended with tokens for the language (`tokenizer.extend_base=true`).

The base's vocabulary and merges stay as they are, so every base token keeps its id (and the warm start copies its
embedding row); the new merges come after the base's. BPE applies the lowest-ranked merge first and no base merge
involves a new token, so a word is first cut into the base's tokens and then the new merges join them: the base's
language, which the new merges rarely touch, is cut as the base cut it (SmolLM2-135M extended by 16,384 Norwegian
tokens cuts an English novel into 0.26% fewer tokens), and its rows stay the trained ones.

The new merges are learnt on the base's own segmentation of the training sample, so they are the ones that fire on
it: each base token is written as one character (from U+10000 on, where no whitespace is), each pre-token of the
sample as the characters of its base tokens, and the `tokenizers` BPE trainer merges those characters; a merge of
two characters is a merge of the two tokens they spell.
"""

from __future__ import annotations

import json
import sys
from typing import Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from pipeline.tokenization.folder import TrainingError

# Token id i is written as chr(FIRST_CODE_POINT + i): every code point from here on is a character that no
# normaliser or whitespace split of the trainer touches.
FIRST_CODE_POINT = 0x10000
MAX_BASE_TOKENS = sys.maxunicode + 1 - FIRST_CODE_POINT


def _spelled_documents(base: Tokenizer, documents: Iterable[str]) -> Iterator[str]:
    """Each document as the base cuts it: its pre-tokens, each the characters of its base token ids, joined by
    spaces (the trainer's word boundaries)."""
    spelled: dict[str, str] = {}  # a pre-token's spelling, once per distinct pre-token
    for document in documents:
        text = base.normalizer.normalize_str(document) if base.normalizer is not None else document
        pieces = base.pre_tokenizer.pre_tokenize_str(text) if base.pre_tokenizer is not None else [(text, None)]
        words = []
        for piece, _ in pieces:
            word = spelled.get(piece)
            if word is None:
                word = spelled[piece] = "".join(chr(FIRST_CODE_POINT + token.id)
                                                for token in base.model.tokenize(piece))
            words.append(word)
        yield " ".join(words)


def extend_bpe(base: Tokenizer, documents: Iterable[str], added_tokens: int, min_frequency: int) -> tuple[Tokenizer,
                                                                                                           dict]:
    """The base tokenizer with up to `added_tokens` new tokens learnt on `documents` (streamed once), and what was
    added: {"base_tokens", "merges", "added_tokens", "existing"} (`existing`: merges whose token the base already
    had, though its own merges never build it that way). Raises TrainingError for a base that is not BPE."""
    spec = json.loads(base.to_str())
    model = spec["model"]
    if model["type"] != "BPE":
        raise TrainingError(f"tokenizer.extend_base=true adds BPE merges, but the base tokenizer is {model['type']}.")
    token_of = {token_id: token for token, token_id in model["vocab"].items()}
    top_id = max([*token_of, *(added["id"] for added in spec.get("added_tokens", []))])
    if top_id >= MAX_BASE_TOKENS:
        raise TrainingError(f"the base tokenizer has ids up to {top_id:,}; extending it handles up to "
                            f"{MAX_BASE_TOKENS - 1:,}.")
    letters = [chr(FIRST_CODE_POINT + token_id) for token_id in token_of]
    trainer_model = Tokenizer(models.BPE())
    trainer_model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=len(letters) + added_tokens, min_frequency=min_frequency,
                                  initial_alphabet=letters, show_progress=sys.stderr.isatty())
    trainer_model.train_from_iterator(_spelled_documents(base, documents), trainer)

    def spelling(word: str) -> str:  # the base tokens that a trainer's token is written with, joined
        return "".join(token_of[ord(letter) - FIRST_CODE_POINT] for letter in word)

    vocab, merges = dict(model["vocab"]), list(model["merges"])
    as_text = bool(merges) and isinstance(merges[0], str)  # "a b" from tokenizers < 0.20, ["a", "b"] since
    learnt = json.loads(trainer_model.to_str())["model"]["merges"]
    existing = 0
    for merge in learnt:
        left, right = map(spelling, merge.split(" ") if isinstance(merge, str) else merge)
        if left + right in vocab:
            existing += 1
        else:
            top_id += 1
            vocab[left + right] = top_id
        merges.append(f"{left} {right}" if as_text else [left, right])
    model["vocab"], model["merges"] = vocab, merges
    summary = {"base_tokens": base.get_vocab_size(), "merges": len(learnt), "added_tokens": len(learnt) - existing,
               "existing": existing}
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False)), summary
