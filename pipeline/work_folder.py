"""The work folder's layout, which every stage and the libraries that read earlier stages' outputs
share: each stage's output at `${work_dir}/<lang>/<stage>/` (a named run's at
`${work_dir}/<lang>/runs/<run>/<stage>/`), finished when its marker `_SUCCESS.json` is there, and
paths inside the work folder recorded relative to it (`${work_dir}/eng/clean`), so that a moved or
copied work folder stays current. How a stage comes to write there (partial folders, hashes, the
lock) is pipeline/contract.py's; how named runs share outputs, pipeline/run_folders.py's; which
files each stage's output holds, pipeline/stage_outputs.py's."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Optional, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

MARKER = "_SUCCESS.json"
WORK_DIR_PREFIX = "${work_dir}/"
# The run of `run=` left out: its stages' outputs where they have always been, `<lang>/<stage>/`.
DEFAULT_RUN = "default"
# Beside the default run's stage folders: `<lang>/runs/<run>/<stage>/` for each named run.
RUNS_FOLDER = "runs"


def language_dir(work_dir, lang: str) -> Path:
    """The folder of everything of language `lang`, the default run's stage outputs; absolute, so
    that Slurm jobs (which may start elsewhere) find the same folder."""
    return Path(work_dir).absolute() / lang


def run_dir(work_dir, lang: str, run: str) -> Path:
    """The folder of run `run`'s stage outputs for language `lang`."""
    language = language_dir(work_dir, lang)
    return language if run == DEFAULT_RUN else language / RUNS_FOLDER / run


def stage_dir(cfg, stage: str) -> Path:
    """cfg's run's output folder of `stage` for cfg's language (of a named run: its own, or a link
    to the same output of another run: pipeline/run_folders.py)."""
    return run_dir(cfg.work_dir, cfg.lang.code, cfg.run) / stage


def portable_path(cfg, path) -> str:
    """How the contract records a path: `${work_dir}/eng/clean` inside the work folder, else
    absolute."""
    return record_path(cfg.work_dir, path)


def record_path(work_dir: str, path) -> str:
    """`portable_path` in the work folder `work_dir`, for the libraries, which take it rather than
    the config."""
    absolute = Path(path).absolute().resolve()
    try:
        return WORK_DIR_PREFIX + str(absolute.relative_to(Path(work_dir).absolute().resolve()))
    except ValueError:
        return str(absolute)


def resolve_path(work_dir: str, recorded: str) -> Path:
    """The path that `portable_path` recorded, in the work folder `work_dir` (wherever it is now)."""
    if recorded.startswith(WORK_DIR_PREFIX):
        return Path(work_dir).absolute() / recorded[len(WORK_DIR_PREFIX) :]
    return Path(recorded)


def output_identity(cfg, path) -> Optional[dict]:
    """For a path inside a finished stage output of this work folder (the demo's base model,
    `${work_dir}/eng/pretrain/hf`): that stage's config hash, which names its content wherever the
    folder is."""
    recorded = portable_path(cfg, path)
    if not recorded.startswith(WORK_DIR_PREFIX):
        return None
    parts = Path(recorded[len(WORK_DIR_PREFIX) :]).parts  # <lang>[/runs/<run>]/<stage>/...
    depth = 4 if len(parts) > 1 and parts[1] == RUNS_FOLDER else 2
    marker = (
        read_marker(Path(cfg.work_dir).absolute().joinpath(*parts[:depth]))
        if len(parts) >= depth
        else None
    )
    if marker is None:
        return None
    return {
        "stage_output": "/".join(parts[:depth]),
        "config_hash": marker["config_hash"],
        "within": "/".join(parts[depth:]),
    }


def read_marker(directory: Path) -> Optional[dict]:
    path = Path(directory) / MARKER
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        log.warning("Ignoring unreadable marker %s; the stage will run again.", path)
        return None


@dataclass(frozen=True)
class OutputFile(Generic[T]):
    """A file of a stage's output and how it is read: what `StageRun.read_input` takes, so that a
    stage reads an earlier output's file with its reader and a damaged one fails naming the stage
    that wrote it."""

    path: Path
    read: Callable[[Path], T]
