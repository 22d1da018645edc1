"""The held-out documents an evaluation reads: the clean stage's held-out split, or `eval.path`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pipeline.corpus.reader import RAW_PATTERNS, find_raw_files
from pipeline.corpus.sources import RAW_FOLDER, SourceInput, clean_output, read_documents


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
    """The folder, the files in it (relative paths) and whether they are raw corpus files (else plain text) that
    `eval.path` names."""
    if path.is_file():
        return path.parent, [path.name], _is_raw(path)
    raw = find_raw_files(path)
    if raw:
        return path, raw, True
    return path, sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()), False


def _raw(folder: Path, files: list[str], scratch: Path) -> Iterator[str]:
    source = SourceInput("eval", folder, RAW_FOLDER, folder, tuple(files), {})
    return (document.text for document in read_documents(source, scratch))


def eval_texts(path: str | None, lang: str, clean_dir: Path, scratch: Path, max_bytes: int) -> Iterator[str]:
    """Whole documents, in a fixed order, until `max_bytes` UTF-8 bytes are reached (the one that crosses it
    included)."""
    if path is None:
        texts = (document.text for document in read_documents(clean_output(lang, clean_dir, split="heldout"), scratch))
    else:
        folder, files, raw = text_files(Path(path))
        texts = _raw(folder, files, scratch) if raw else _plain_lines([folder / name for name in files])
    taken = 0
    for text in texts:
        if taken >= max_bytes:
            return
        taken += len(text.encode("utf-8"))
        yield text


def describe_text(path: str | None, clean_dir: Path) -> str:
    return f"the clean stage's held-out split ({clean_dir / 'heldout'})" if path is None else str(Path(path).resolve())
