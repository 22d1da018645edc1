"""Where the mix stage's sources are and how big they are; the plan's sources found again by later
stages.

The mix stage locates and measures them; the tokenizer and pack stages read the planned ones again
(`planned_source`). A source is a clean stage output or a folder of raw files
(pipeline/corpus/sources.py).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.corpus.reader import RAW_PATTERNS
from pipeline.corpus.sources import (
    RAW_FOLDER,
    FileTask,
    SourceInput,
    clean_output,
    over_files,
    raw_folder,
    source_reader,
)
from pipeline.errors import StageError
from pipeline.languages import LANGUAGES
from pipeline.run_folders import in_run
from pipeline.work_folder import MARKER, read_marker, resolve_path, stage_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Skipped:
    name: str
    path: Path
    reason: str


# Stages whose output is a corpus in the clean stage's layout (the replay stage writes the base's
# samples so).
CORPUS_STAGES = ("clean", "replay")


def _stage_command(path: Path, work_dir: str) -> str:
    """The command that creates `path` when it is `<work_dir>/<lang>/clean` (or `replay`); else
    empty."""
    if path.name in CORPUS_STAGES and path.parent.name in LANGUAGES:
        base = (
            " model.base=<Hugging Face folder> replay.tokens=<tokens>"
            if path.name == "replay"
            else ""
        )
        return f"python -m pipeline stage={path.name} lang={path.parent.name} work_dir={work_dir}{base}"
    return ""


def planned_source(entry: dict, work_dir: str) -> SourceInput:
    """A source of the mix plan (its `plan.json` entry), to read again, in the work folder
    `work_dir` wherever it is now (the plan records paths inside it relative to it)."""
    path = resolve_path(work_dir, entry["path"])
    if entry["input"] == RAW_FOLDER:
        return raw_folder(entry["name"], path)
    if read_marker(path) is None:
        command = _stage_command(path, work_dir) or "python -m pipeline stage=clean lang=<lang>"
        raise StageError(
            f"The mix plan's source `{entry['name']}` is the clean output {path}, which has no "
            f"{MARKER} "
            f"any more. Run {command}, then the mix stage again."
        )
    return clean_output(entry["name"], path)


def _locate(
    name: str, key: str, path: Path, optional: bool, work_dir: str
) -> SourceInput | Skipped:
    command = _stage_command(path, work_dir)
    if not path.exists():
        if optional:
            return Skipped(
                name, path, "does not exist" + (f"; to add it: {command}" if command else "")
            )
        hint = (
            f"It looks like the clean output of {path.parent.name}: create it first with {command}"
            if command
            else f"Point `{key}` at a clean stage output (<work_dir>/<lang>/clean) or a folder of "
            "raw "
            f"{', '.join(RAW_PATTERNS)} files, or remove the source from mix.sources"
        )
        raise StageError(f"mix source `{name}` ({key}): {path} does not exist. {hint}.")
    if not path.is_dir():
        raise StageError(
            f"mix source `{name}` ({key}): {path} is not a folder. Point `{key}` at a folder."
        )

    marker = read_marker(path)
    if marker is None and command:
        if optional:
            return Skipped(
                name, path, f"its {path.name} stage has not finished (no {MARKER}); run: {command}"
            )
        raise StageError(
            f"mix source `{name}` ({key}): {path} has no {MARKER}, so its {path.name} stage has "
            "not "
            f"finished. Run: {command}"
        )
    if marker is not None:
        if marker.get("stage") not in CORPUS_STAGES:
            raise StageError(
                f"mix source `{name}` ({key}): {path} is the output of stage "
                f"`{marker.get('stage')}`; "
                "point it at a clean stage output (<work_dir>/<lang>/clean), the base's samples "
                "(<work_dir>/<lang>/replay) or a folder of raw files."
            )
        return clean_output(name, path)

    source = raw_folder(name, path)
    if not source.files:
        raise StageError(
            f"mix source `{name}` ({key}): no {', '.join(RAW_PATTERNS)} files in {path} "
            "(subfolders "
            f"included). Add files there or point `{key}` elsewhere."
        )
    return source


def locate_sources(cfg) -> tuple[list[SourceInput], list[Skipped]]:
    """The configured sources that can be read, and those skipped (missing optional ones, the
    target)."""
    target_dir = stage_dir(cfg, "clean").resolve()
    found, skipped = [], []
    for index, source in enumerate(cfg.mix.sources):
        # A named run's own clean output of the base's language where it has one (the demo's base).
        path = in_run(cfg, Path(source.path).absolute().resolve())
        if path == target_dir:
            skipped.append(
                Skipped(
                    source.name, path, "the target language's own clean output, always in the mix"
                )
            )
            continue
        key = f"mix.sources.{index}.path"
        if source.name == cfg.lang.code:
            raise StageError(
                f"mix source `{source.name}` ({key}: {path}) has the target language's name but "
                "not its "
                f"clean output ({target_dir}); give it another name."
            )
        located = _locate(source.name, key, path, source.optional, cfg.work_dir)
        (skipped if isinstance(located, Skipped) else found).append(located)
    return found, skipped


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Measurement:
    docs: int = 0
    bytes: int = 0
    bad_records: int = 0
    docs_without_cluster_size: int = 0
    # duplicate-cluster size -> [documents, UTF-8 bytes]; size 1 for documents without one
    by_cluster_size: dict[int, list[int]] = field(default_factory=dict)

    def add(self, other: "Measurement") -> None:
        self.docs += other.docs
        self.bytes += other.bytes
        self.bad_records += other.bad_records
        self.docs_without_cluster_size += other.docs_without_cluster_size
        for size, (docs, size_bytes) in other.by_cluster_size.items():
            row = self.by_cluster_size.setdefault(size, [0, 0])
            row[0] += docs
            row[1] += size_bytes


def _measure_file(task: FileTask) -> Measurement:
    """Measure file number `index` of the source (the reader's shard `index` of one file each)."""
    source, paths_file, bad_records_dir, index = task
    reader = source_reader(source, paths_file, bad_records_dir)
    measured = Measurement()
    for document in reader.run(rank=index, world_size=len(source.files)):
        size = document.metadata.get("minhash_cluster_size")
        if size is None:
            measured.docs_without_cluster_size += 1
        text_bytes = len(document.text.encode("utf-8"))
        row = measured.by_cluster_size.setdefault(int(size or 1), [0, 0])
        row[0] += 1
        row[1] += text_bytes
        measured.docs += 1
        measured.bytes += text_bytes
    measured.bad_records = int(reader.stats["bad_records"].total)
    return measured


def measure(source: SourceInput, scratch: Path, workers: int) -> Measurement:
    """Documents, UTF-8 bytes and duplicate-cluster sizes of a source; bad records are logged in
    `scratch`."""
    total = Measurement()
    for measured in over_files(
        source, scratch, workers, _measure_file, f"mix: measuring {source.name}"
    ):
        total.add(measured)
    if not total.bad_records:
        shutil.rmtree(scratch / "bad_records", ignore_errors=True)  # one empty log per file read
    else:
        log.warning(
            "mix: %d bad records in source `%s` (%s) were skipped; see %s",
            total.bad_records,
            source.name,
            source.path,
            scratch / "bad_records",
        )
    return total
