"""Named runs: their names, their folders, and the outputs they share.

`run=<name>` gives an experiment stage folders of its own,
`${work_dir}/<lang>/runs/<name>/<stage>/`, beside the default run's `${work_dir}/<lang>/<stage>/`
(pipeline/work_folder.py). A stage of a named run whose config hash (its config and its inputs'
hashes, pipeline/contract.py) is the hash of a finished output of the default run or of another
named run does not run again: its folder becomes a relative symbolic link to that output, and
`.<stage>.shared.json` beside the link records the hash it was shared at. Everything reads through the link as through a folder of the run's own. Reading a
link's marker checks that hash (`current_marker`): when the run that owns the output runs the stage
again with another config, the link leads to another output than the one shared, and the stage
counts as not done for the sharing run, which then runs it in a folder of its own. A named run
writes only under its own folder; the default run's folders are as they always were.

Names reach folder names and Slurm scripts: letters, digits and `._+-`, starting with a letter or a
digit, without `..`, at most 100 characters. A Hydra multirun names its runs from the swept values
(`swept_run_name`: `train.lr=0.0001` becomes `train.lr-0.0001`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.json_files import read_json, write_json_atomic
from pipeline.work_folder import DEFAULT_RUN, RUNS_FOLDER, read_marker, run_dir

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
MAX_NAME = 100
# `runs=all`: every run of the language (stage=compare); not a run's name.
ALL_RUNS = "all"
NAME_RULE = (
    "letters, digits and . _ + -, starting with a letter or a digit, without `..`, at most "
    f"{MAX_NAME} characters (it names a folder and reaches Slurm scripts), e.g. lr-3e-4"
)
# `init=continue:<run>`: pretrain starts from that run's final training state.
CONTINUE_PREFIX = "continue:"


def check_run_name(key: str, name: str) -> None:
    """Raise ConfigError naming `key` when `name` cannot name a run."""
    if not (
        isinstance(name, str)
        and _NAME.fullmatch(name)
        and ".." not in name
        and len(name) <= MAX_NAME
        and name != ALL_RUNS
    ):
        raise ConfigError(key, name, [NAME_RULE, f"not `{ALL_RUNS}`"])


def swept_run_name(override_dirname: str) -> str:
    """A multirun job's run name from its swept overrides as Hydra lists them
    (`hydra.job.override_dirname`, `mix.max_epochs=2,train.lr=0.0001`): `=` becomes `-`, `,`
    becomes `+`, any other character outside the names' alphabet `_`; a name longer than the
    limit keeps its start and a hash of the whole."""
    name = _UNSAFE.sub("_", override_dirname.replace("=", "-").replace(",", "+"))
    while ".." in name:
        name = name.replace("..", ".")
    name = name.strip("._+-") or "run"
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(override_dirname.encode("utf-8")).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9].rstrip('._+-')}-{digest}"
    return name


def continued_run(init: str) -> Optional[str]:
    """The run that `init=continue:<run>` continues; None for another `init`."""
    return init[len(CONTINUE_PREFIX) :] if init.startswith(CONTINUE_PREFIX) else None


def _record(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}.shared.json")


def share(folder: Path, target: Path, config_hash: str) -> None:
    """Make the stage folder `folder` (absent, or a link) a relative link to the finished output
    `target` of hash `config_hash`. The record is written first: a kill in between leaves a link
    whose record does not match, which counts as not done."""
    relative = os.path.relpath(target, folder.parent)
    write_json_atomic(_record(folder), {"shares": relative, "config_hash": config_hash})
    link = folder.with_name(f".{folder.name}.link-{os.getpid()}")
    link.unlink(missing_ok=True)
    os.symlink(relative, link)
    os.replace(link, folder)


def unshare(folder: Path) -> None:
    """Remove the link `folder` and its record (never what it leads to)."""
    folder.unlink(missing_ok=True)
    _record(folder).unlink(missing_ok=True)


def current_marker(folder: Path) -> Optional[dict]:
    """The marker of the stage output `folder`, as the run that reads it may use it: a link's only
    while the output it leads to has the hash it was shared at."""
    marker = read_marker(folder)
    if marker is None or not folder.is_symlink():
        return marker
    try:
        shared_hash = read_json(_record(folder))["config_hash"]
    except (OSError, ValueError, KeyError, TypeError):
        shared_hash = None
    if marker.get("config_hash") != shared_hash:
        log.warning(
            "%s links to %s, which has changed since it was shared (config hash %s, now %s): "
            "the stage counts as not done for this run, and runs again in a folder of its own.",
            folder,
            folder.resolve(),
            shared_hash,
            marker.get("config_hash"),
        )
        return None
    return marker


def language_runs(work_dir, lang: str, stages: tuple[str, ...]) -> list[str]:
    """The runs that have a folder for `lang`: the default run where one of its `stages` has a
    folder, then the named runs in name order."""
    language = run_dir(work_dir, lang, DEFAULT_RUN)
    named = language / RUNS_FOLDER
    default = [DEFAULT_RUN] if any((language / stage).is_dir() for stage in stages) else []
    others = (
        sorted(path.name for path in named.iterdir() if path.is_dir()) if named.is_dir() else []
    )
    return default + others


def matching_output(work_dir, lang: str, run: str, stage: str, digest: str) -> Optional[Path]:
    """A finished output of `stage` with the config hash `digest` in a folder of its own of another
    run than `run` (the default run's first); None if there is none."""
    for other in language_runs(work_dir, lang, (stage,)):
        folder = run_dir(work_dir, lang, other) / stage
        if other == run or folder.is_symlink():
            continue
        marker = read_marker(folder)
        if marker is not None and marker.get("config_hash") == digest:
            return folder
    return None


def owning_run(output: Path, work_dir, lang: str) -> str:
    """The run whose own folder holds the stage output `output` (a resolved link target)."""
    parent = Path(output).parent
    return DEFAULT_RUN if parent == run_dir(work_dir, lang, DEFAULT_RUN).resolve() else parent.name


def shared_stages(work_dir, lang: str, run: str, stages: tuple[str, ...]) -> dict[str, str]:
    """Which of `stages` run `run` shares for `lang`, each with the run whose output it is."""
    folders = {stage: run_dir(work_dir, lang, run) / stage for stage in stages}
    return {
        stage: owning_run(folder.resolve(), work_dir, lang)
        for stage, folder in folders.items()
        if folder.is_symlink()
    }


def in_run(cfg, path: Path) -> Path:
    """`path` as cfg's run reads it: a stage folder of the default run (`${work_dir}/eng/clean`, a
    mix source) is the named run's folder of that language and stage when the run has one."""
    work = Path(cfg.work_dir).absolute().resolve()
    if cfg.run == DEFAULT_RUN or not path.is_relative_to(work):
        return path
    parts = path.relative_to(work).parts
    if len(parts) != 2:
        return path
    own = run_dir(cfg.work_dir, parts[0], cfg.run) / parts[1]
    return own.resolve() if own.is_dir() else path
