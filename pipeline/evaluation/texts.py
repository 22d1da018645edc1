"""The held-out documents an evaluation reads: the clean stage's held-out split, or `eval.path`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pipeline.corpus.reader import RAW_PATTERNS, find_raw_files
from pipeline.mixing.sources import RAW_FOLDER, SourceInput, clean_output, read_documents


def _is_raw(path: Path) -> bool:
    return any(path.match(pattern) for pattern in RAW_PATTERNS)


def _plain_lines(files: list[Path]) -> Iterator[str]:
    """Plain text, one document per non-empty line (FLORES sentences)."""
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.strip():
                    yield line.rstrip("\n")


def _raw(folder: Path, files: list[str], scratch: Path) -> Iterator[str]:
    source = SourceInput("eval", folder, RAW_FOLDER, folder, tuple(files), {})
    return (document.text for document in read_documents(source, scratch))


def eval_texts(path: str | None, lang: str, clean_dir: Path, scratch: Path, max_bytes: int) -> Iterator[str]:
    """Whole documents, in a fixed order, until `max_bytes` UTF-8 bytes are reached (the one that crosses it
    included)."""
    if path is None:
        texts = (document.text for document in read_documents(clean_output(lang, clean_dir, split="heldout"), scratch))
    else:
        where = Path(path)
        if where.is_file():
            texts = _raw(where.parent, [where.name], scratch) if _is_raw(where) else _plain_lines([where])
        elif find_raw_files(where):
            texts = _raw(where, find_raw_files(where), scratch)
        else:
            texts = _plain_lines(sorted(p for p in where.rglob("*") if p.is_file()))
    taken = 0
    for text in texts:
        if taken >= max_bytes:
            return
        taken += len(text.encode("utf-8"))
        yield text


def describe_text(path: str | None, clean_dir: Path) -> str:
    return f"the clean stage's held-out split ({clean_dir / 'heldout'})" if path is None else str(Path(path).resolve())
