"""Stage `tokenizer`: a tokenizer for the language, trained on the mix plan's data, and how well it fits.

Samples the training text from the mix plan's sources in the plan's proportions, bounded by
`tokenizer.sample_bytes` (pipeline/tokenization/sample.py); trains byte-level BPE with Hugging Face
`tokenizers` or SentencePiece (Unigram or BPE, converted to `tokenizers`); writes `tokenizer.json`
(and SentencePiece's `tokenizer.model`) with the files `transformers` needs; and scores it, next to
the base model's tokenizer (`tokenizer.base`, else `model.base`'s), on the held-out text of `clean`:
`report.json`, `report.md`, the table in the log and the scores in the marker. With
`tokenizer.keep_base=true` it trains nothing: it adopts the base's tokenizer (`tokenizer.base`, else
`model.base`) with the base's own special tokens, writes the same files and scores it, so that the data
can be packed for continued pretraining with the old vocabulary. With `tokenizer.extend_base=true` it keeps the
base's tokenizer and adds `tokenizer.added_tokens` tokens learnt on the sample as the base cuts it
(pipeline/tokenization/extension.py) from the target language's text alone, with the base's own special tokens,
leaving out the tokens that the plan's other sources use (`tokenizer.spare_ratio`).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

from datatrove.utils.word_tokenizers import load_word_tokenizer
from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.corpus.report import bytes_text
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.corpus.words import resolve_word_tokenizer
from pipeline.errors import StageError
from pipeline.json_files import read_json, write_json_atomic
from pipeline.tokenization.extension import Spared, extend_bpe
from pipeline.tokenization.folder import (TOKENIZER_FILE, TrainedTokenizer, TrainingError, adopt_base_tokenizer,
                                          base_tokenizer_file, base_tokenizer_roles, load_tokenizer,
                                          write_tokenizer_folder, write_transformers_files)
from pipeline.tokenization.metrics import Scores, evaluate
from pipeline.tokenization.report import (METRICS, comparison, extended_section, kept_section, markdown, metrics_table,
                                          sample_section, tokenizer_section)
from pipeline.tokenization.sample import SampledSource, read_sample, write_sample
from pipeline.tokenization.training import padded_vocab_size, train_tokenizer
from pipeline.work_folder import portable_path

log = logging.getLogger(__name__)

# The sample of the plan's other sources that an extension spares (held in memory, cut a few times).
SPARED_SAMPLE_BYTES = 32_000_000


def base_source(cfg: PipelineConfig) -> Optional[str]:
    """The base tokenizer, to compare with (or, kept, to adopt): `tokenizer.base`, else `model.base`'s. The demo
    (`stage=all` without model.base) gives its own English base model as model.base."""
    return cfg.tokenizer.base if cfg.tokenizer.base is not None else cfg.model.base


def base_file(cfg: PipelineConfig) -> Optional[Path]:
    """The base tokenizer's tokenizer.json; None when there is no base, or model.base holds none (nothing to
    compare with: a stage that needs the base's tokenizer says so itself)."""
    source = base_source(cfg)
    return None if source is None else base_tokenizer_file(source)


def describe_inputs(cfg: PipelineConfig) -> dict:
    """The base tokenizer's content: a changed base file reruns the report (or, kept, the stage)."""
    path = base_file(cfg)
    if path is None and (cfg.tokenizer.keep_base or cfg.tokenizer.extend_base):  # tokenizer.base: the config's check
        key, use = ("keep_base", "adopts") if cfg.tokenizer.keep_base else ("extend_base", "extends")
        raise StageError(f"tokenizer.{key}=true {use} the tokenizer of model.base={base_source(cfg)}, but it holds "
                         f"no {TOKENIZER_FILE}. Save the model's tokenizer there, or give tokenizer.base=<its "
                         f"{TOKENIZER_FILE} or folder>.")
    if path is None:
        return {}
    return {"base_tokenizer": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}}


def no_heldout_advice(clean) -> str:
    """What to do when the clean stage held out nothing, given its settings (`clean`): never a setting in force."""
    if clean.heldout_fraction == 0 and clean.heldout_min_documents == 0:
        return "run clean with clean.heldout_fraction > 0 or clean.heldout_min_documents > 0."
    return (f"with clean.heldout_fraction={clean.heldout_fraction:g} and clean.heldout_min_documents="
            f"{clean.heldout_min_documents}, the clean stage kept too few documents to hold any out: add text to the "
            "language's raw folder, or give eval text to stage=evaluate with eval.path=.")


def read_plan(run: StageRun) -> dict:
    return run.read_input("mix", "plan.json", read_json)


def _empty_sample_message(run: StageRun, sampled: list[SampledSource]) -> str:
    found = "; ".join(f"`{s.share.name}` ({s.folder or s.path}): {s.documents_read:,} documents read, planned bytes "
                      f"{bytes_text(s.share.planned_bytes)}" for s in sampled)
    return (f"tokenizer {run.lang}: no training text. The mix plan's sources gave nothing: {found}. Check that "
            f"these folders hold the documents the plan counted (if they were removed or rewritten, run "
            f"python -m pipeline stage=clean lang={run.lang} and stage=mix again) and that tokenizer.sample_bytes "
            f"({run.cfg.tokenizer.sample_bytes:,}) is large enough to take whole documents.")


class HeldoutText:
    """The held-out documents of `clean`, up to `eval_bytes`; says afterwards whether it stopped early."""

    def __init__(self, clean_dir: Path, lang: str, scratch: Path, eval_bytes: int) -> None:
        self.source = clean_output(lang, clean_dir, split="heldout")
        self.scratch = scratch
        self.eval_bytes = eval_bytes
        self.truncated = False

    def __iter__(self) -> Iterator[str]:
        taken = 0
        for document in read_documents(self.source, self.scratch):
            if taken >= self.eval_bytes:
                self.truncated = True
                return
            taken += len(document.text.encode("utf-8"))
            yield document.text


def _notes(options, trained_vocab: int, vocab_size: int) -> list[str]:
    notes = []
    if trained_vocab < vocab_size:
        notes.append(f"The training text gave only {trained_vocab:,} of the {vocab_size:,} tokens asked for (not a "
                     "multiple of 128): give it more text or lower tokenizer.vocab_size.")
    if options.normalization == "nfkc":
        notes.append("normalization=nfkc folds compatibility characters (ﬁ -> fi, full-width forms, superscripts), "
                     "so decode(encode(x)) differs from x wherever the text has them; normalization=none keeps it "
                     "exact.")
    if options.backend == "sentencepiece":
        notes.append("SentencePiece writes spaces as U+2581 (▁), so a literal ▁ in the text decodes as a space.")
    return notes


def _sample(run: StageRun, sample_file: Path, scratch: Path, target_only: bool = False) -> dict:
    """Write the training sample (of the whole plan, or of the target language's text alone); the report's section on
    it. Fails if it is empty.

    A new tokenizer learns from the whole plan. Added tokens learn from the target language's text alone: they are
    the language's, and merges learnt on the other sources (the base's own language replayed, fillers) would only
    cut those anew. On SmolLM2 and the unread English book, 625 added-token ids with the novels in the sample, 208
    without, for the same Norwegian (0.2012 and 0.2008 tokens per byte; a 2-core probe of 30 MB)."""
    cfg, options = run.cfg, run.cfg.tokenizer
    sources = [source for source in read_plan(run)["sources"] if not target_only or source["name"] == run.lang]
    sampled = write_sample(sources, options.sample_bytes, options.seed, sample_file, scratch, cfg.work_dir,
                           cfg.workers)
    sample = sample_section(sampled, options.sample_bytes)
    if sample["bytes"] == 0:
        raise StageError(_empty_sample_message(run, sampled))
    for source in sample["sources"]:  # recorded as the contract records paths: relative to the work folder inside it
        source["folder"] = source["folder"] and portable_path(cfg, source["folder"])
    log.info("tokenizer %s: sampled %s (%d documents) from %s; %s", run.lang, bytes_text(sample["bytes"]),
             sample["documents"], ", ".join(f"{s['name']} {bytes_text(s['bytes'])}" for s in sample["sources"]),
             "extending the base tokenizer" if options.extend_base else f"training {options.backend}")
    return sample


def _train(run: StageRun, sample_file: Path) -> TrainedTokenizer:
    options = run.cfg.tokenizer
    try:
        trained = train_tokenizer(read_sample(sample_file), options, run.cfg.workers)
    except TrainingError as error:
        raise StageError(f"tokenizer {run.lang}: {error} Lower tokenizer.vocab_size (now {options.vocab_size}) or "
                         "give the trainer more text (tokenizer.sample_bytes, the mix plan's sources).") from None
    wanted, got = padded_vocab_size(options.vocab_size), trained.tokenizer.get_vocab_size()
    if got < wanted:
        log.warning("tokenizer %s: the training text gave only %d of the %d tokens asked for.", run.lang, got, wanted)
    return trained


def _score(run: StageRun, new: Tokenizer, scratch: Path) -> tuple[dict[str, Scores], HeldoutText, str]:
    """The scores of the new tokenizer (and the base one, unless it is the new one) on the held-out text, and the
    word tokenizer's name."""
    options = run.cfg.tokenizer
    tokenizers = {"new": new}
    base = base_file(run.cfg)
    if base is not None and not options.keep_base:
        try:
            tokenizers["base"] = load_tokenizer(base)
        except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
            raise StageError(f"{base} (the base tokenizer) is not a tokenizer.json that `tokenizers` can load "
                             f"({error}).") from None
    word_tokenizer, word_tokenizer_name = resolve_word_tokenizer(run.cfg.lang)
    heldout = HeldoutText(run.input("clean"), run.lang, scratch / "heldout", options.eval_bytes)
    scores = evaluate(tokenizers, heldout, load_word_tokenizer(word_tokenizer))
    if not scores["new"].documents:
        log.warning("tokenizer %s: %s holds no held-out documents, so the report has no scores; %s", run.lang,
                    heldout.source.folder, no_heldout_advice(run.cfg.clean))
    return scores, heldout, word_tokenizer_name


def _keep_base(run: StageRun) -> tuple[Tokenizer, dict]:
    """The base's tokenizer, adopted into the stage's folder; the report's section on it."""
    source = base_source(run.cfg)
    file = base_tokenizer_file(source).resolve()
    try:
        tokenizer, roles = adopt_base_tokenizer(run.work_dir, source)
    except Exception as error:  # ValueError for a missing EOS; tokenizers raises a bare Exception for a bad file
        raise StageError(f"tokenizer {run.lang}: tokenizer.keep_base=true cannot adopt {file}: {error}") from None
    log.info("tokenizer %s: kept the base tokenizer %s (%d tokens; %s); nothing trained", run.lang, file,
             tokenizer.get_vocab_size(), ", ".join(f"{role} {token}" for role, token in roles.items()))
    return tokenizer, kept_section(file, tokenizer, roles, run.work_dir)


def _spared(run: StageRun, scratch: Path, target_sample: Path, target_bytes: int) -> Optional[Spared]:
    """A sample of the plan's other sources (the base's language replayed, fillers) for the added tokens to spare,
    and about as many bytes of the target's sample (`target_bytes` in all), every k-th document of it, so that each
    of its sources counts; None with tokenizer.spare_ratio null or no other source in the plan."""
    ratio = run.cfg.tokenizer.spare_ratio
    others = [source for source in read_plan(run)["sources"] if source["name"] != run.lang]
    if ratio is None or not others:
        return None
    sample_file = scratch / "spared_sample.jsonl"
    write_sample(others, SPARED_SAMPLE_BYTES, run.cfg.tokenizer.seed, sample_file, scratch, run.cfg.work_dir,
                 run.cfg.workers)
    texts = list(read_sample(sample_file))
    if not texts:
        return None
    every = max(1, round(target_bytes / sum(len(text.encode("utf-8")) for text in texts)))
    spared = Spared(texts, [text for index, text in enumerate(read_sample(target_sample)) if index % every == 0],
                    ratio)
    log.info("tokenizer %s: added tokens that %s of %s use are left out", run.lang, bytes_text(spared.bytes),
             ", ".join(source["name"] for source in others))
    return spared


def _extend_base(run: StageRun, scratch: Path) -> tuple[Tokenizer, dict, dict]:
    """The base's tokenizer with the language's tokens added, in the stage's folder; the report's sections."""
    options = run.cfg.tokenizer
    source = base_source(run.cfg)
    file = base_tokenizer_file(source).resolve()
    try:
        base, roles = base_tokenizer_roles(source)
    except Exception as error:  # ValueError for a missing EOS; tokenizers raises a bare Exception for a bad file
        raise StageError(f"tokenizer {run.lang}: tokenizer.extend_base=true cannot extend {file}: {error}") from None
    sample_file = scratch / "training_sample.jsonl"
    sample = _sample(run, sample_file, scratch, target_only=True)
    spared = _spared(run, scratch, sample_file, sample["bytes"])
    # The total a multiple of 128, as a trained vocabulary's.
    wanted = padded_vocab_size(base.get_vocab_size() + options.added_tokens) - base.get_vocab_size()
    try:
        tokenizer, added = extend_bpe(base, partial(read_sample, sample_file), wanted, options.min_frequency, spared)
    except TrainingError as error:
        raise StageError(f"tokenizer {run.lang}: cannot extend {file}: {error} Use tokenizer.keep_base=true, or "
                         "train a new tokenizer (tokenizer.extend_base=false).") from None
    if added["added_tokens"] < wanted:
        log.warning("tokenizer %s: the training text gave only %d of the %d added tokens asked for.", run.lang,
                    added["added_tokens"], wanted)
    tokenizer.save(str(run.work_dir / TOKENIZER_FILE))
    write_transformers_files(run.work_dir, roles)
    log.info("tokenizer %s: extended the base tokenizer %s (%d tokens) by %d tokens (%d merges; %d learnt tokens "
             "left out as the other sources use them)", run.lang, file, added["base_tokens"], added["added_tokens"],
             added["merges"], added["left_out"])
    section = extended_section(file, tokenizer, roles, {**added, "spared_bytes": spared.bytes if spared else 0}, wanted,
                               run.work_dir)
    return tokenizer, section, sample


def _train_new(run: StageRun, scratch: Path) -> tuple[Tokenizer, dict, dict, list[str]]:
    """A tokenizer trained on the mix plan's sample, in the stage's folder; the report's sections and notes."""
    options = run.cfg.tokenizer
    sample_file = scratch / "training_sample.jsonl"
    sample = _sample(run, sample_file, scratch)
    trained = _train(run, sample_file)
    write_tokenizer_folder(run.work_dir, trained, options.special_tokens)
    notes = _notes(options, trained.tokenizer.get_vocab_size(), padded_vocab_size(options.vocab_size))
    return trained.tokenizer, tokenizer_section(options, trained, run.cfg.workers), sample, notes


def _name(options, lang: str) -> str:
    if options.keep_base:
        return "base, kept"
    return "base, extended" if options.extend_base else f"{lang} {options.backend}"


def run_tokenizer(run: StageRun) -> dict:
    options, lang = run.cfg.tokenizer, run.lang
    scratch = run.work_dir / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)  # an interrupted run's sample is rewritten from the start
    scratch.mkdir(parents=True)
    if options.keep_base:
        tokenizer, section = _keep_base(run)
        sample, notes = None, []
    elif options.extend_base:
        tokenizer, section, sample = _extend_base(run, scratch)
        notes = []
    else:
        tokenizer, section, sample, notes = _train_new(run, scratch)
    scores, heldout, word_tokenizer_name = _score(run, tokenizer, scratch)
    new, base = scores["new"], scores.get("base")

    document = {
        "lang": lang,
        "tokenizer": section,
        "sample": sample,
        "heldout": {"folder": portable_path(run.cfg, heldout.source.folder), "documents": new.documents, "bytes": new.bytes,
                    "words": new.words, "word_tokenizer": word_tokenizer_name, "eval_bytes": options.eval_bytes,
                    "truncated": heldout.truncated, "advice": no_heldout_advice(run.cfg.clean)},
        "new": {"name": _name(options, lang),
                "path": portable_path(run.cfg, run.final_dir / TOKENIZER_FILE),
                "scores": new.summary()},
        "base": None if base is None else {"name": base_source(run.cfg),
                                           "path": portable_path(run.cfg, base_file(run.cfg)),
                                           "scores": base.summary()},
        "new_vs_base": comparison(new, base),
        "notes": notes,
    }
    write_json_atomic(run.work_dir / "report.json", document)
    (run.work_dir / "report.md").write_text(markdown(document), encoding="utf-8")
    if new.documents:
        log.info("tokenizer %s on %d held-out documents:\n%s", lang, new.documents, metrics_table(document))
    shutil.rmtree(scratch)
    return {
        "backend": None if options.keep_base or options.extend_base else options.backend,
        "kept_base": section.get("kept_base"),
        "extended_base": section.get("extended_base"),
        "vocab_size": document["tokenizer"]["vocab_size"],
        "sample_bytes": 0 if sample is None else sample["bytes"],
        "sample_documents": 0 if sample is None else sample["documents"],
        "heldout_documents": new.documents,
        "heldout_words": new.words,
        "new": {key: document["new"]["scores"][key] for key in METRICS},
        "base": None if base is None else {key: document["base"]["scores"][key] for key in METRICS},
    }


STAGE = Stage(
    name="tokenizer",
    run=run_tokenizer,
    needs=("clean", "mix"),
    config_sections=("tokenizer",),
    # The base tokenizer enters the hash by its content (describe_inputs), not by where it is.
    unhashed_keys=("tokenizer.base",),
    describe_inputs=describe_inputs,
)
