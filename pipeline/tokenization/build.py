"""The tokenizer stage's tokenizer, made in its folder in one of three ways:

- trained (the default without a base to extend): byte-level BPE with Hugging Face `tokenizers` or
  SentencePiece (Unigram or BPE, converted to `tokenizers`: training.py) on a sample of the mix
  plan's sources in the plan's proportions, within `tokenizer.sample_bytes` (sample.py);
- kept (`tokenizer.keep_base=true`): the base's tokenizer with the base's own special tokens,
  nothing trained, so that the data can be packed for continued pretraining with the old vocabulary;
- extended (`tokenizer.extend_base=true`): the base's tokenizer with `tokenizer.added_tokens` tokens
  learnt on the sample as the base cuts it (extension.py) from the target language's text alone,
  leaving out the tokens that the plan's other sources use (`tokenizer.spare_ratio`).

Each writes `tokenizer.json` (and SentencePiece's `tokenizer.model`) with the files `transformers`
needs (folder.py) and gives the report's sections on it (report.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tokenizers import Tokenizer

from pipeline.corpus.report import bytes_text
from pipeline.errors import StageError
from pipeline.progress import Progress, count
from pipeline.tokenization.tokenizer_config import TokenizerConfig
from pipeline.tokenization.extension import (
    Spared,
    base_cuts,
    check_extendable,
    extend_bpe,
    pieces,
)
from pipeline.tokenization.folder import (
    TOKENIZER_FILE,
    TrainedTokenizer,
    TrainingError,
    adopt_base_tokenizer,
    base_tokenizer_file,
    base_tokenizer_roles,
    write_tokenizer_folder,
    write_transformers_files,
)
from pipeline.tokenization.report import (
    extended_section,
    kept_section,
    sample_section,
    tokenizer_section,
)
from pipeline.tokenization.sample import SampledSource, read_sample, write_sample
from pipeline.tokenization.training import padded_vocab_size, train_tokenizer
from pipeline.work_folder import record_path

log = logging.getLogger(__name__)

# The sample of the plan's other sources that an extension spares (held in memory, cut a few times).
SPARED_SAMPLE_BYTES = 32_000_000


@dataclass(frozen=True)
class BuiltTokenizer:
    tokenizer: Tokenizer
    # The report's sections: on the tokenizer, and on its training sample (None: kept, nothing
    # trained).
    section: dict
    sample: Optional[dict]
    notes: list[str]


def build_tokenizer(
    folder: Path,
    options: TokenizerConfig,
    lang: str,
    plan_sources: list[dict],
    base: Optional[str],
    work_dir: str,
    workers: int,
    scratch: Path,
) -> BuiltTokenizer:
    """The tokenizer of `lang` in `folder`, as `options` say, from the mix plan's sources (its
    plan.json entries, paths in the work folder `work_dir`) and the base tokenizer `base` (a
    tokenizer.json or a folder with one); samples are written in `scratch`."""
    making = _Making(folder, options, lang, plan_sources, base, work_dir, workers, scratch)
    if options.keep_base:
        return making.keep_base()
    if options.extend_base:
        return making.extend_base()
    return making.train_new()


def _notes(options: TokenizerConfig, trained_vocab: int, vocab_size: int) -> list[str]:
    notes = []
    if trained_vocab < vocab_size:
        notes.append(
            f"The training text gave only {trained_vocab:,} of the {vocab_size:,} tokens asked for "
            "(not a "
            "multiple of 128): give it more text or lower tokenizer.vocab_size."
        )
    if options.normalization == "nfkc":
        notes.append(
            "normalization=nfkc folds compatibility characters (ﬁ -> fi, full-width forms, "
            "superscripts), "
            "so decode(encode(x)) differs from x wherever the text has them; normalization=none "
            "keeps it "
            "exact."
        )
    if options.backend == "sentencepiece":
        notes.append(
            "SentencePiece writes spaces as U+2581 (▁), so a literal ▁ in the text decodes as a "
            "space."
        )
    return notes


@dataclass(frozen=True)
class _Making:
    """What every way of making the tokenizer reads (build_tokenizer's arguments)."""

    folder: Path
    options: TokenizerConfig
    lang: str
    plan_sources: list[dict]
    base: Optional[str]
    work_dir: str
    workers: int
    scratch: Path

    def _empty_sample_message(self, sampled: list[SampledSource]) -> str:
        found = "; ".join(
            f"`{s.share.name}` ({s.folder or s.path}): {s.documents_read:,} documents read, "
            "planned "
            f"bytes {bytes_text(s.share.planned_bytes)}"
            for s in sampled
        )
        return (
            f"tokenizer {self.lang}: no training text. The mix plan's sources gave nothing: "
            f"{found}. Check that "
            "these folders hold the documents the plan counted (if they were removed or "
            "rewritten, run "
            f"python -m pipeline stage=clean lang={self.lang} and stage=mix again) and that "
            f"tokenizer.sample_bytes ({self.options.sample_bytes:,}) is large enough to take whole "
            "documents."
        )

    def sample(self, sample_file: Path, target_only: bool = False) -> dict:
        """Write the training sample (of the whole plan, or of the target language's text alone);
        the report's section on it. Fails if it is empty.

        A new tokenizer learns from the whole plan. Added tokens learn from the target language's
        text alone: they are the language's, and merges learnt on the other sources (the base's own
        language replayed, fillers) would only cut those anew. On SmolLM2 and the unread English
        book, 625 added-token ids with the novels in the sample, 208 without, for the same Norwegian
        (0.2012 and 0.2008 tokens per byte; a 2-core probe of 30 MB)."""
        options = self.options
        sources = [
            source for source in self.plan_sources if not target_only or source["name"] == self.lang
        ]
        sampled = write_sample(
            sources,
            options.sample_bytes,
            options.seed,
            sample_file,
            self.scratch,
            self.work_dir,
            self.workers,
        )
        sample = sample_section(sampled, options.sample_bytes)
        if sample["bytes"] == 0:
            raise StageError(self._empty_sample_message(sampled))
        for source in sample[
            "sources"
        ]:  # recorded as the contract records paths: relative to the work folder
            source["folder"] = source["folder"] and record_path(self.work_dir, source["folder"])
        log.info(
            "tokenizer %s: sampled %s (%d documents) from %s; %s",
            self.lang,
            bytes_text(sample["bytes"]),
            sample["documents"],
            ", ".join(f"{s['name']} {bytes_text(s['bytes'])}" for s in sample["sources"]),
            "extending the base tokenizer"
            if options.extend_base
            else f"training {options.backend}",
        )
        return sample

    def _train(self, sample_file: Path) -> TrainedTokenizer:
        options = self.options
        try:
            trained = train_tokenizer(read_sample(sample_file), options)
        except TrainingError as error:
            raise StageError(
                f"tokenizer {self.lang}: {error} Lower tokenizer.vocab_size (now "
                f"{options.vocab_size}) "
                "or give the trainer more text (tokenizer.sample_bytes, the mix plan's sources)."
            ) from None
        wanted, got = padded_vocab_size(options.vocab_size), trained.tokenizer.get_vocab_size()
        if got < wanted:
            log.warning(
                "tokenizer %s: the training text gave only %d of the %d tokens asked for.",
                self.lang,
                got,
                wanted,
            )
        return trained

    def train_new(self) -> BuiltTokenizer:
        """A tokenizer trained on the mix plan's sample."""
        options = self.options
        sample_file = self.scratch / "training_sample.jsonl"
        sample = self.sample(sample_file)
        trained = self._train(sample_file)
        write_tokenizer_folder(self.folder, trained, options.special_tokens)
        notes = _notes(
            options, trained.tokenizer.get_vocab_size(), padded_vocab_size(options.vocab_size)
        )
        return BuiltTokenizer(trained.tokenizer, tokenizer_section(options, trained), sample, notes)

    def keep_base(self) -> BuiltTokenizer:
        """The base's tokenizer, adopted."""
        file = base_tokenizer_file(self.base).resolve()
        try:
            tokenizer, roles = adopt_base_tokenizer(self.folder, self.base)
        # ValueError for a missing EOS; StageError for a missing or unreadable file
        except Exception as error:
            raise StageError(
                f"tokenizer {self.lang}: tokenizer.keep_base=true cannot adopt {file}: {error}"
            ) from None
        log.info(
            "tokenizer %s: kept the base tokenizer %s (%d tokens; %s); nothing trained",
            self.lang,
            file,
            tokenizer.get_vocab_size(),
            ", ".join(f"{role} {token}" for role, token in roles.items()),
        )
        return BuiltTokenizer(
            tokenizer, kept_section(file, tokenizer, roles, self.folder), None, []
        )

    def _progress(self, what: str, total: Optional[int]) -> Progress:
        return Progress(f"tokenizer {self.lang}: {what}", total, "B", log)

    def _spared(self, base: Tokenizer, target_sample: Path, target_bytes: int) -> Optional[Spared]:
        """A sample of the plan's other sources (the base's language replayed, fillers) for the
        added tokens to spare, and about as many bytes of the target's sample (`target_bytes` in
        all), every k-th document of it, so that each of its sources counts; None with
        tokenizer.spare_ratio null or no other source in the plan."""
        ratio = self.options.spare_ratio
        others = [source for source in self.plan_sources if source["name"] != self.lang]
        if ratio is None or not others:
            return None
        sample_file = self.scratch / "spared_sample.jsonl"
        sampled = write_sample(
            others,
            SPARED_SAMPLE_BYTES,
            self.options.seed,
            sample_file,
            self.scratch,
            self.work_dir,
            self.workers,
        )
        if not sum(source.documents for source in sampled):
            return None
        with self._progress("cutting the spared text", sum(s.bytes for s in sampled)) as progress:
            text = pieces(base, read_sample(sample_file), self.workers, progress)
        every = max(1, round(target_bytes / max(1, text.bytes)))
        every_kth = (
            document
            for index, document in enumerate(read_sample(target_sample))
            if index % every == 0
        )
        with self._progress("cutting the target's text to spare", None) as progress:
            target = pieces(base, every_kth, self.workers, progress)
        log.info(
            "tokenizer %s: added tokens that %s of %s use are left out",
            self.lang,
            bytes_text(text.bytes),
            ", ".join(source["name"] for source in others),
        )
        return Spared(text, target, ratio)

    def _extendable_base(self, file: Path) -> tuple[Tokenizer, dict[str, str]]:
        """The base's tokenizer and its special tokens by role, refused before any work if it
        cannot be extended."""
        try:
            base, roles = base_tokenizer_roles(self.base)
        # ValueError for a missing EOS; StageError for a missing or unreadable file
        except Exception as error:
            raise StageError(
                f"tokenizer {self.lang}: tokenizer.extend_base=true cannot extend {file}: {error}"
            ) from None
        try:
            check_extendable(base)
        except TrainingError as error:
            raise StageError(
                f"tokenizer {self.lang}: cannot extend {file}: {error} Use "
                "tokenizer.keep_base=true, or "
                "train a new tokenizer (tokenizer.extend_base=false)."
            ) from None
        return base, roles

    def extend_base(self) -> BuiltTokenizer:
        """The base's tokenizer with the language's tokens added."""
        options = self.options
        file = base_tokenizer_file(self.base).resolve()
        base, roles = self._extendable_base(file)
        sample_file = self.scratch / "training_sample.jsonl"
        sample = self.sample(sample_file, target_only=True)
        with self._progress("cutting the sample as the base does", sample["bytes"]) as progress:
            words = base_cuts(base, read_sample(sample_file), self.workers, progress)
        spared = self._spared(base, sample_file, sample["bytes"])
        # The total a multiple of 128, as a trained vocabulary's.
        wanted = (
            padded_vocab_size(base.get_vocab_size() + options.added_tokens) - base.get_vocab_size()
        )
        log.info(
            "tokenizer %s: learning %d merges from %s distinct pre-tokens (%s in all)",
            self.lang,
            wanted,
            count(len(words)),
            count(words.total()),
        )
        tokenizer, added = extend_bpe(base, words, wanted, options.min_frequency, spared)
        if added["added_tokens"] < wanted:
            log.warning(
                "tokenizer %s: the training text gave only %d of the %d added tokens asked for.",
                self.lang,
                added["added_tokens"],
                wanted,
            )
        tokenizer.save(str(self.folder / TOKENIZER_FILE))
        write_transformers_files(self.folder, roles)
        log.info(
            "tokenizer %s: extended the base tokenizer %s (%d tokens) by %d tokens (%d merges; %d "
            "learnt tokens "
            "left out as the other sources use them)",
            self.lang,
            file,
            added["base_tokens"],
            added["added_tokens"],
            added["merges"],
            added["left_out"],
        )
        section = extended_section(
            file,
            tokenizer,
            roles,
            {**added, "spared_bytes": spared.text.bytes if spared else 0},
            wanted,
            self.folder,
        )
        return BuiltTokenizer(tokenizer, section, sample, [])
