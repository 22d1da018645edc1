"""The typed `tokenizer` section: backend, vocabulary size, special tokens, pre-tokenizer, samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.errors import ConfigError, closest_first

# GPT-4's split pattern (cl100k, as in Llama 3) with two changes for many languages: combining marks
# (\p{M}: Devanagari vowel signs, decomposed accents) stay inside words, and the English
# contractions ('s, 't, 're ...) are not special (`'s` still splits off as punctuation + letters).
# Runs of 1-3 digits, punctuation with its leading space, newlines and other whitespace runs are
# pieces of their own.
DEFAULT_PRETOKENIZER_PATTERN = r"[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}{1,3}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TOKENIZER_BACKENDS = ("bytelevel_bpe", "sentencepiece")
SENTENCEPIECE_MODEL_TYPES = ("unigram", "bpe")
NORMALIZATIONS = ("none", "nfkc")


@dataclass
class SpecialTokens:
    """The special tokens, at ids 0-3 in this order."""

    bos: str = "<s>"
    eos: str = "</s>"
    pad: str = "<pad>"
    unk: str = "<unk>"

    def in_id_order(self) -> list[str]:
        return [self.bos, self.eos, self.pad, self.unk]


@dataclass
class TokenizerConfig:
    backend: str = "bytelevel_bpe"
    # For backend=sentencepiece.
    sentencepiece_model_type: str = "unigram"
    # Rounded up to a multiple of 128 (tensor-parallel embedding shards and GPU kernels want it).
    vocab_size: int = 32768
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    # `none` keeps decode(encode(x)) == x; `nfkc` folds compatibility characters and breaks that.
    normalization: str = "none"
    # For backend=bytelevel_bpe: the regex that splits text into pre-tokens before BPE.
    pretokenizer_pattern: str = DEFAULT_PRETOKENIZER_PATTERN
    # The longest token the trainer may learn: bytes for bytelevel_bpe, characters for
    # sentencepiece. None: no limit for bytelevel_bpe, SentencePiece's own 16 for sentencepiece.
    max_token_length: Optional[int] = None
    # For backend=bytelevel_bpe: a pair seen fewer times is never merged.
    min_frequency: int = 2
    # Cap on the training text sampled from the mix plan's sources (UTF-8 bytes): bounds memory and
    # time.
    sample_bytes: int = 1_000_000_000
    # Cap on the held-out text the report evaluates (UTF-8 bytes).
    eval_bytes: int = 100_000_000
    seed: int = 1
    # The base model's tokenizer to compare with: a tokenizer.json file or a folder holding one.
    base: Optional[str] = None
    # Train nothing: adopt the base's tokenizer (`base`, else `model.base`'s tokenizer.json), to
    # continue pretraining with the old vocabulary (the baseline the new tokenizer and the warm
    # start are measured against).
    keep_base: bool = False
    # Extend the base's BPE tokenizer (`base`, else `model.base`'s) with `added_tokens` tokens
    # learnt on the mix plan's sample as the base cuts it (pipeline/tokenization/extension.py):
    # every base token keeps its id, and the base's language is cut as before. `vocab_size` does not
    # apply; the total is rounded up to a multiple of 128. `keep_base=true` wins over it. null: true
    # with `model.base`, false without (pipeline/config.py: BASE_MODEL_RULES).
    extend_base: Optional[bool] = None
    added_tokens: int = 16384
    # With extend_base: an added token is left out where the plan's other sources (the base's own
    # language replayed, fillers) use it at least this many times as often per byte as the target's
    # text, since each use there cuts the base's language anew (about 10 bits each to SmolLM2, even
    # after pretrain). null: none left out.
    spare_ratio: Optional[float] = 0.01


def validate_tokenizer(tok: TokenizerConfig) -> None:
    # tokenizers (a Rust extension) only when the section is checked, not when the CLI only composes
    # it
    from tokenizers import Regex

    from pipeline.tokenization.folder import base_tokenizer_file

    for key, value, allowed in (
        ("backend", tok.backend, TOKENIZER_BACKENDS),
        ("sentencepiece_model_type", tok.sentencepiece_model_type, SENTENCEPIECE_MODEL_TYPES),
        ("normalization", tok.normalization, NORMALIZATIONS),
    ):
        if value not in allowed:
            raise ConfigError(f"tokenizer.{key}", value, closest_first(value, allowed))
    specials = tok.special_tokens.in_id_order()
    if len(set(specials)) != len(specials) or any(
        not t or t != "".join(t.split()) for t in specials
    ):
        raise ConfigError(
            "tokenizer.special_tokens",
            specials,
            ["four distinct non-empty strings without whitespace"],
        )
    smallest = 256 + len(specials)
    if tok.vocab_size <= smallest:
        raise ConfigError(
            "tokenizer.vocab_size",
            tok.vocab_size,
            [
                f"an integer > {smallest} (256 byte tokens + {len(specials)} special tokens, "
                "before any learned token); "
                "it is rounded up to a multiple of 128, e.g. 32768"
            ],
        )
    if tok.max_token_length is not None and not 2 <= tok.max_token_length <= 512:
        raise ConfigError(
            "tokenizer.max_token_length",
            tok.max_token_length,
            ["null (no limit for bytelevel_bpe, 16 for sentencepiece)", "an integer in [2, 512]"],
        )
    if tok.added_tokens < 1:
        raise ConfigError(
            "tokenizer.added_tokens", tok.added_tokens, ["an integer >= 1, e.g. 16384"]
        )
    if tok.spare_ratio is not None and not tok.spare_ratio >= 0:
        raise ConfigError(
            "tokenizer.spare_ratio",
            tok.spare_ratio,
            ["null (no added token left out)", "a number >= 0, e.g. 0.01"],
        )
    for key in ("min_frequency", "seed"):
        if getattr(tok, key) < 0:
            raise ConfigError(f"tokenizer.{key}", getattr(tok, key), ["an integer >= 0"])
    for key in ("sample_bytes", "eval_bytes"):
        if getattr(tok, key) < 1:
            raise ConfigError(
                f"tokenizer.{key}",
                getattr(tok, key),
                ["a positive number of UTF-8 bytes, e.g. 1000000000"],
            )
    try:
        Regex(tok.pretokenizer_pattern)
    except Exception as error:  # tokenizers raises a bare Exception for Oniguruma syntax errors
        raise ConfigError(
            "tokenizer.pretokenizer_pattern",
            tok.pretokenizer_pattern,
            [f"an Oniguruma regular expression ({error})"],
        ) from None
    if tok.base is not None and base_tokenizer_file(tok.base) is None:
        raise ConfigError(
            "tokenizer.base",
            tok.base,
            [
                "null",
                "a local tokenizer.json file",
                "a local folder holding a tokenizer.json (a Hugging Face model folder)",
            ],
        )
