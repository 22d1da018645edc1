"""How well the tokenizer stage's tokenizer fits the language: scored, next to the base model's
tokenizer, on the held-out text of the clean stage (metrics.py), and reported as data and as text
(report.py) and in the log."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, Optional

from datatrove.utils.word_tokenizers import load_word_tokenizer
from tokenizers import Tokenizer

from pipeline.corpus.clean_config import CleanConfig, no_heldout_advice
from pipeline.corpus.sources import SourceInput, read_documents
from pipeline.corpus.words import resolve_word_tokenizer
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
from pipeline.progress import Progress
from pipeline.languages import LanguageConfig
from pipeline.tokenization.build import BuiltTokenizer
from pipeline.tokenization.tokenizer_config import TokenizerConfig
from pipeline.tokenization.folder import TOKENIZER_FILE, base_tokenizer_file, load_tokenizer
from pipeline.tokenization.metrics import Scores, evaluate
from pipeline.tokenization.report import (
    METRICS,
    REPORT_FILE,
    REPORT_TEXT_FILE,
    comparison,
    markdown,
    metrics_table,
)
from pipeline.work_folder import record_path

log = logging.getLogger(__name__)


class HeldoutText:
    """The held-out documents, up to `eval_bytes`; says afterwards whether it stopped early."""

    def __init__(self, source: SourceInput, scratch: Path, eval_bytes: int) -> None:
        self.source = source
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


def _score(
    new: Tokenizer,
    base_file: Optional[Path],
    options: TokenizerConfig,
    heldout: HeldoutText,
    lang: LanguageConfig,
    clean: CleanConfig,
    workers: int,
) -> tuple[dict[str, Scores], str]:
    """The scores of the new tokenizer (and the base one, unless it is the new one) on the held-out
    text, and the word tokenizer's name."""
    tokenizers = {"new": new}
    if base_file is not None and not options.keep_base:
        try:
            tokenizers["base"] = load_tokenizer(base_file)
        except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
            raise StageError(
                f"{base_file} (the base tokenizer) is not a tokenizer.json that `tokenizers` can "
                "load "
                f"({error})."
            ) from None
    word_tokenizer, word_tokenizer_name = resolve_word_tokenizer(lang)
    texts = list(heldout)  # at most tokenizer.eval_bytes: read first, to know how much is left
    size = sum(len(text.encode("utf-8")) for text in texts)
    with Progress(f"tokenizer {lang.code}: scoring", size, "B", log) as progress:
        scores = evaluate(tokenizers, texts, load_word_tokenizer(word_tokenizer), workers, progress)
    if not scores["new"].documents:
        log.warning(
            "tokenizer %s: %s holds no held-out documents, so the report has no scores; %s",
            lang.code,
            heldout.source.folder,
            no_heldout_advice(clean),
        )
    return scores, word_tokenizer_name


def _name(options: TokenizerConfig, lang: str) -> str:
    if options.keep_base:
        return "base, kept"
    return "base, extended" if options.extend_base else f"{lang} {options.backend}"


def write_report(
    folder: Path,
    final_dir: Path,
    built: BuiltTokenizer,
    options: TokenizerConfig,
    base: Optional[str],
    heldout_text: SourceInput,
    lang: LanguageConfig,
    clean: CleanConfig,
    work_dir: str,
    scratch: Path,
    workers: int,
) -> dict:
    """Score the tokenizer `built` in `folder` (where it will be: `final_dir`) and the base's
    (`base`: a tokenizer.json or a folder with one) on `heldout_text`, which the clean stage held
    out with the settings `clean`, on `workers` processes; write the report to `folder` and return
    the marker's metrics. Paths inside the work folder `work_dir` are recorded relative to it."""
    base_file = None if base is None else base_tokenizer_file(base)
    heldout = HeldoutText(heldout_text, scratch / "heldout", options.eval_bytes)
    scores, word_tokenizer_name = _score(
        built.tokenizer, base_file, options, heldout, lang, clean, workers
    )
    new, base_scores = scores["new"], scores.get("base")
    document = {
        "lang": lang.code,
        "tokenizer": built.section,
        "sample": built.sample,
        "heldout": {
            "folder": record_path(work_dir, heldout.source.folder),
            "documents": new.documents,
            "bytes": new.bytes,
            "words": new.words,
            "word_tokenizer": word_tokenizer_name,
            "eval_bytes": options.eval_bytes,
            "truncated": heldout.truncated,
            "advice": no_heldout_advice(clean),
        },
        "new": {
            "name": _name(options, lang.code),
            "path": record_path(work_dir, final_dir / TOKENIZER_FILE),
            "scores": new.summary(),
        },
        "base": None
        if base_scores is None
        else {
            "name": base,
            "path": record_path(work_dir, base_file),
            "scores": base_scores.summary(),
        },
        "new_vs_base": comparison(new, base_scores),
        "notes": built.notes,
    }
    write_json_atomic(folder / REPORT_FILE, document)
    (folder / REPORT_TEXT_FILE).write_text(markdown(document), encoding="utf-8")
    if new.documents:
        log.info(
            "tokenizer %s on %d held-out documents:\n%s",
            lang.code,
            new.documents,
            metrics_table(document),
        )
    sample = built.sample
    return {
        "backend": None if options.keep_base or options.extend_base else options.backend,
        "kept_base": built.section.get("kept_base"),
        "extended_base": built.section.get("extended_base"),
        "vocab_size": document["tokenizer"]["vocab_size"],
        "sample_bytes": 0 if sample is None else sample["bytes"],
        "sample_documents": 0 if sample is None else sample["documents"],
        "heldout_documents": new.documents,
        "heldout_words": new.words,
        "new": {key: document["new"]["scores"][key] for key in METRICS},
        "base": None
        if base_scores is None
        else {key: document["base"]["scores"][key] for key in METRICS},
    }
