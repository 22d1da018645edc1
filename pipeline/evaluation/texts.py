"""The held-out text an evaluation reads, as named sets that every model is scored on:

- `heldout`: the clean stage's held-out split (documents drawn at random from the training corpus),
  or `eval.path`;
- `heldout_source`: the clean stage's `heldout_source` split, whole sources
  (`clean.heldout_sources`) that no stage trains on: the language outside the training text's
  domain; one set per pattern when there are several (`heldout_source:<pattern>`; Norwegian:
  regjeringen.no's white papers, and Universal Dependencies' news and blogs);
- `base_lang`: held-out text of the base model's language (`model.base_lang`):
  `eval.base_lang_path`, or what that language's clean stage held out when it is done: its held-out
  sources, one set per pattern of its `heldout_sources` when there are several
  (`base_lang:<pattern>`; English: a novel the replay never reads, and Universal Dependencies' web
  text, reviews and email, a domain it never replays), else its held-out split; a recipe that makes
  the model forget it shows here;
- `flores200:<name>`: each `eval.tasks` entry of layout `flores200`, FLORES-200's `<lang>.devtest`
  (one sentence per line, each a document): a published set that every paper's model can be scored
  on.

A set without text is skipped with the reason, never an error; only `heldout` is required. A
FLORES-200 file that is missing, empty or not UTF-8 fails, naming the file and the line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from pipeline.corpus.heldout import is_heldout_source
from pipeline.corpus.reader import RAW_PATTERNS, find_raw_files, fingerprint_files
from pipeline.corpus.sources import (
    HELDOUT_SOURCE_SPLIT,
    HELDOUT_SPLIT,
    RAW_FOLDER,
    SourceInput,
    clean_output,
    read_documents,
)
from pipeline.errors import StageError
from pipeline.evaluation.eval_config import FLORES, TaskConfig, task_name
from pipeline.languages import LANGUAGES, language_config
from pipeline.work_folder import DEFAULT_RUN, read_marker, stage_dir

HELDOUT, HELDOUT_SOURCE, BASE_LANG = "heldout", "heldout_source", "base_lang"


def _is_raw(path: Path) -> bool:
    return any(path.match(pattern) for pattern in RAW_PATTERNS)


def _plain_lines(files: list[Path]) -> Iterator[str]:
    """Plain text, one document per non-empty line (FLORES sentences)."""
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.strip():
                    yield line.rstrip("\n")


def text_files(path: Path) -> tuple[Path, list[str], bool]:
    """The folder, the files in it (relative paths) and whether they are raw corpus files (else
    plain text) that `eval.path` names."""
    if path.is_file():
        return path.parent, [path.name], _is_raw(path)
    raw = find_raw_files(path)
    if raw:
        return path, raw, True
    return path, sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()), False


def _raw(folder: Path, files: list[str], scratch: Path) -> Iterator:
    return read_documents(
        SourceInput("eval", folder, RAW_FOLDER, folder, tuple(files), {}), scratch
    )


@dataclass(frozen=True)
class TextSet:
    """One held-out set: a clean stage's split, or a file or folder the user gave."""

    name: str  # HELDOUT, HELDOUT_SOURCE, BASE_LANG, or either of the last two `:<pattern>`
    title: str  # its column in the report
    where: str  # what the text is, for people
    # Either a clean stage output and its split (of a held-out source split, only the documents of
    # the sources that these `clean.heldout_sources` patterns name; empty: all of it) ...
    clean: Optional[Path] = None
    split: str = HELDOUT_SPLIT
    sources: tuple[str, ...] = ()
    # ... or a file or folder of JSONL/Parquet, or of plain text with one document per line.
    path: Optional[str] = None

    def records(self, scratch: Path, max_bytes: int) -> list[tuple[str, dict]]:
        """(text, metadata) of whole documents, in a fixed order, until `max_bytes` UTF-8 bytes are
        reached (the one that crosses it included). Plain text has no metadata; the clean reader's
        records carry their raw file."""
        if self.path is None:
            found = (
                (document.text, document.metadata)
                for document in read_documents(
                    clean_output(self.name, self.clean, split=self.split), scratch / self.name
                )
                if not self.sources
                or is_heldout_source(
                    document.metadata.get("raw_file", ""),
                    str(document.metadata.get("source", "")),
                    self.sources,
                )
            )
        else:
            folder, files, raw = text_files(Path(self.path))
            found = (
                (
                    (document.text, document.metadata)
                    for document in _raw(folder, files, scratch / self.name)
                )
                if raw
                else ((text, {}) for text in _plain_lines([folder / name for name in files]))
            )
        taken, chosen = 0, []
        for text, metadata in found:
            if taken >= max_bytes:
                break
            taken += len(text.encode("utf-8"))
            chosen.append((text, metadata))
        return chosen

    def identity(self) -> dict:
        """What the set's text is, for the evaluate stage's config hash: a clean output by its hash
        (its own language's enters through the contract), files by their content."""
        if self.path is not None:
            folder, files, _ = text_files(Path(self.path))
            return fingerprint_files(folder, files)
        return {
            "clean_config_hash": read_marker(self.clean)["config_hash"],
            "split": self.split,
            "sources": list(self.sources),
        }


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and bool(find_raw_files(folder))


def heldout_set(path: Optional[str], lang: str, clean: Optional[Path]) -> TextSet:
    if path is not None:
        return TextSet(HELDOUT, "eval.path", str(Path(path).resolve()), path=path)
    return TextSet(
        HELDOUT,
        "held-out split",
        f"the held-out split of {lang}'s clean stage ({clean / HELDOUT_SPLIT})",
        clean=clean,
    )


def _held_out_sources(
    name: str, title: str, code: str, clean: Path, patterns: list[str]
) -> list[TextSet]:
    """The sources a clean stage held out whole as one set, or, when it held out several
    (`clean.heldout_sources` patterns), a set per source, `<name>:<pattern>`, with its own documents
    only: text of different kinds (a novel, web text; white papers, news) is not averaged away."""
    where = f"of the sources {code}'s clean stage held out whole ({clean / HELDOUT_SOURCE_SPLIT})"
    if len(patterns) < 2:
        return [
            TextSet(name, title, f"the documents {where}", clean=clean, split=HELDOUT_SOURCE_SPLIT)
        ]
    return [
        TextSet(
            f"{name}:{pattern}",
            f"{title} {pattern}",
            f"the documents matching {pattern} {where}",
            clean=clean,
            split=HELDOUT_SOURCE_SPLIT,
            sources=(pattern,),
        )
        for pattern in patterns
    ]


def _source_patterns(clean: Path) -> list[str]:
    return (read_marker(clean) or {}).get("metrics", {}).get("heldout_source_patterns") or []


def heldout_source_set(lang: str, clean: Optional[Path]) -> list[TextSet] | str:
    """The clean stage's held-out sources, or why there are none."""
    if clean is None:
        return f"{lang}'s clean stage is not done, so there is no held-out source (clean.heldout_sources)"
    folder = clean / HELDOUT_SOURCE_SPLIT
    if not _has_files(folder):
        return (
            f"the clean stage held out no source ({folder} holds no shard): name raw files in "
            f"clean.heldout_sources to score the language outside the training text's domain"
        )
    return _held_out_sources(
        HELDOUT_SOURCE, "held-out source", lang, clean, _source_patterns(clean)
    )


def base_lang_clean(cfg) -> Path:
    """The clean stage output of the base model's language, in this work folder: the run's own (or
    its link to another run's), else the default run's, which a named run's lone `stage=evaluate`
    has not linked."""
    code = cfg.model.base_lang
    base = dataclasses.replace(cfg, lang=language_config(code, LANGUAGES[code]))
    own = stage_dir(base, "clean")
    if read_marker(own) is not None:
        return own
    return stage_dir(dataclasses.replace(base, run=DEFAULT_RUN), "clean")


def is_base_lang(name: str) -> bool:
    """Whether the set `name` is text of the base model's language."""
    return name == BASE_LANG or name.startswith(f"{BASE_LANG}:")


def base_lang_sets(cfg) -> list[TextSet] | str:
    """Held-out text of the base model's language, or why there is none."""
    code = cfg.model.base_lang
    title = f"{code} held-out"
    if cfg.eval.base_lang_path is not None:
        return [
            TextSet(
                BASE_LANG,
                title,
                str(Path(cfg.eval.base_lang_path).resolve()),
                path=cfg.eval.base_lang_path,
            )
        ]
    if code == cfg.lang.code:
        return f"model.base_lang is {code}, the language evaluated: its held-out text is the `{HELDOUT}` set"
    clean = base_lang_clean(cfg)
    if read_marker(clean) is None:
        return (
            f"no held-out text of the base model's language {code} (model.base_lang): run python "
            "-m pipeline "
            f"stage=clean lang={code} work_dir={cfg.work_dir}, or give eval.base_lang_path=<file "
            "or folder>"
        )
    # The sources it held out whole first: the mix replays its training text several times, so
    # held-out pages of the same books flatter the model. Each source apart: text of the replayed
    # kind, and of kinds never replayed.
    if _has_files(clean / HELDOUT_SOURCE_SPLIT):
        return _held_out_sources(BASE_LANG, title, code, clean, _source_patterns(clean))
    if not _has_files(clean / HELDOUT_SPLIT):
        return f"{code}'s clean stage ({clean}) held out no document"
    return [
        TextSet(
            BASE_LANG,
            title,
            f"the held-out split of {code}'s clean stage ({clean / HELDOUT_SPLIT})",
            clean=clean,
        )
    ]


def _check_plain_text(file: Path) -> None:
    """A FLORES-200 file: one language's sentences as UTF-8 text, one per line."""
    if not file.is_file():
        raise StageError(
            f"The flores200 path {file} is not a file: give one language's file, e.g. "
            ".../flores200_dataset/devtest/nob_Latn.devtest."
        )
    with open(file, "rb") as handle:
        lines = list(handle)
    for number, line in enumerate(lines, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise StageError(
                f"FLORES-200 file {file}, line {number}: not UTF-8 text ({error}). Give the file "
                "as FLORES-200 ships it, or remove the flores200 entry from eval.tasks."
            ) from None
    if not any(line.strip() for line in lines):
        raise StageError(
            f"FLORES-200 file {file} holds no sentence. Give the file as FLORES-200 ships it (one "
            "sentence per line), or remove the flores200 entry from eval.tasks."
        )


def flores_sets(tasks: list[TaskConfig]) -> list[TextSet]:
    """The held-out sets that eval.tasks' flores200 entries name, each file checked."""
    sets = []
    for task in tasks:
        if task.layout != FLORES:
            continue
        _check_plain_text(Path(task.path))
        name = task_name(task)
        sets.append(
            TextSet(
                f"{FLORES}:{name}",
                f"FLORES-200 {name}",
                f"FLORES-200's {task.language} sentences, one document each "
                f"({Path(task.path).resolve()})",
                path=task.path,
            )
        )
    return sets


def text_sets(cfg, clean: Optional[Path]) -> tuple[list[TextSet], dict[str, str]]:
    """The sets to score, in the report's order (FLORES-200's last), and the reason each missing
    one is skipped."""
    sets, skipped = [heldout_set(cfg.eval.path, cfg.lang.code, clean)], {}
    for name, found in (
        (HELDOUT_SOURCE, heldout_source_set(cfg.lang.code, clean)),
        (BASE_LANG, base_lang_sets(cfg)),
    ):
        if isinstance(found, str):
            skipped[name] = found
        else:
            sets.extend(found)
    return [*sets, *flores_sets(cfg.eval.tasks)], skipped
