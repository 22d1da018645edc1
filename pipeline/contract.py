"""The stage contract: where a stage writes, when it may be skipped, and how its output appears.

Every stage writes under `${work_dir}/${lang}/<stage>/` and ends with `_SUCCESS.json`, whose
`config_hash` covers the stage's own config sections and the hashes of its inputs. A stage whose
marker matches is skipped; a stage that reruns first removes the markers of the stages after it.
Work happens in a partial folder named after the config hash (so an interrupted run with the same
config resumes there) and is renamed into place only when complete: a killed stage never leaves a
folder that looks finished.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from pipeline.errors import StageError

log = logging.getLogger(__name__)

MARKER = "_SUCCESS.json"


@dataclass(frozen=True)
class Stage:
    name: str
    # `run_<stage>(run)`: does the work in `StageRun.work_dir` and returns the metrics for the contract to commit,
    # or None when it calls `StageRun.commit` itself (clean does, so that the same step can end a Slurm chain).
    run: Callable[["StageRun"], Optional[dict]]
    # Stages whose outputs this one always reads.
    needs: tuple[str, ...] = ()
    # Stages whose outputs this one reads under some configs (pretrain init=warmup reads warmup's).
    needs_when: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    # Stages whose outputs this one reads when they are done, and goes without otherwise (evaluate's models).
    reads_if_done: tuple[str, ...] = ()
    # Added to the message that names missing inputs: the other ways to run this stage.
    hint: str = ""
    # Top-level config sections that change this stage's output (hashed).
    config_sections: tuple[str, ...] = ()
    # Keys inside those sections that do not change the output (parallelism, not results).
    unhashed_keys: tuple[str, ...] = ()
    # Describes external inputs (e.g. a fingerprint of the raw files); hashed too.
    describe_inputs: Callable[[Any], dict] = lambda cfg: {}
    # Trains on GPUs (pipeline/training/): stage=workflow gives it GPU nodes and srun starts its ranks.
    gpu: bool = False


@dataclass
class StageRun:
    """What a stage needs to know about one run; picklable, so Slurm jobs can commit it."""

    stage: str
    lang: str
    cfg: Any
    config_hash: str
    inputs: dict
    hashed_config: dict
    work_dir: Path
    final_dir: Path
    # The finished outputs of earlier stages this run reads (`input`).
    upstream: dict[str, Path] = field(default_factory=dict)

    def input(self, stage: str) -> Path:
        """The finished output folder of an earlier stage that this stage declares it reads."""
        if stage not in self.upstream:
            raise StageError(f"stage `{self.stage}` reads the output of `{stage}`, which it does not declare or "
                             f"which is not done; this is a bug, please report it.")
        return self.upstream[stage]

    def has_input(self, stage: str) -> bool:
        return stage in self.upstream

    def commit(self, metrics: dict) -> dict:
        """Write the marker into the finished work folder and move it into place."""
        marker = {
            "stage": self.stage,
            "lang": self.lang,
            "config_hash": self.config_hash,
            "inputs": self.inputs,
            "metrics": metrics,
            "config": self.hashed_config,
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        write_json_atomic(self.work_dir / MARKER, marker)
        old = self.final_dir.with_name(f".{self.stage}.replaced-{os.getpid()}")
        if self.final_dir.exists():
            os.replace(self.final_dir, old)
        os.replace(self.work_dir, self.final_dir)
        shutil.rmtree(old, ignore_errors=True)
        log.info("%s for %s finished: %s", self.stage, self.lang, self.final_dir / MARKER)
        return marker


def stage_dir(cfg, stage: str) -> Path:
    # Absolute, so that Slurm jobs (which may start elsewhere) find the same folder.
    return Path(cfg.work_dir).absolute() / cfg.lang.code / stage


def read_marker(directory: Path) -> Optional[dict]:
    path = Path(directory) / MARKER
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        log.warning("Ignoring unreadable marker %s; the stage will run again.", path)
        return None


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def hashed_config(stage: Stage, cfg) -> dict:
    sections = {}
    for name in stage.config_sections:
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            value = OmegaConf.to_container(OmegaConf.structured(value), resolve=True)
        sections[name] = value
    for dotted in stage.unhashed_keys:
        section, _, key = dotted.partition(".")
        sections.get(section, {}).pop(key, None)
    return sections


def config_hash(stage: Stage, config: dict, inputs: dict) -> str:
    payload = json.dumps({"stage": stage.name, "config": config, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Expected:
    """What a run of the stage would be now: its inputs, hashed config and their hash."""

    upstream: dict[str, Path]
    inputs: dict
    config: dict
    digest: str


def expected(stage: Stage, cfg) -> Expected:
    """Read the inputs' markers and hash the config; no side effects. Raises StageError naming every missing
    input at once, with the commands that make them."""
    needed = tuple(dict.fromkeys((*stage.needs, *stage.needs_when(cfg))))
    markers = {name: read_marker(stage_dir(cfg, name)) for name in (*needed, *stage.reads_if_done)}
    missing = [name for name in needed if markers[name] is None]
    if missing:
        commands = "; ".join(f"python -m pipeline stage={name} lang={cfg.lang.code} work_dir={cfg.work_dir}"
                             for name in missing)
        names = ", ".join(f"`{name}`" for name in missing)
        raise StageError(f"Stage `{stage.name}` for {cfg.lang.code} needs the output of stage{'s' * (len(missing) > 1)} "
                         f"{names}, not done yet (no {MARKER} in "
                         f"{', '.join(str(stage_dir(cfg, name)) for name in missing)}). Run first: {commands}."
                         f"{' ' + stage.hint if stage.hint else ''}")
    done = {name: marker for name, marker in markers.items() if marker is not None}
    upstream = {name: stage_dir(cfg, name) for name in done}
    # Earlier outputs enter the hash by their own hashes, not their paths: a moved work folder stays current.
    inputs = {**stage.describe_inputs(cfg), **{name: {"config_hash": marker["config_hash"]}
                                               for name, marker in done.items()}}
    config = hashed_config(stage, cfg)
    return Expected(upstream=upstream, inputs=inputs, config=config, digest=config_hash(stage, config, inputs))


def is_current(stage: Stage, cfg) -> bool:
    """Whether the stage's marker matches what a run would produce now (stage=workflow asks before submitting).

    Unlike `prepare`, it changes nothing: no invalidation, no partial folder. A missing input (or one that
    cannot be described yet) means the stage is not current.
    """
    marker = read_marker(stage_dir(cfg, stage.name))
    if marker is None:
        return False  # the common case of a fresh sweep: no need to hash anything
    try:
        return marker.get("config_hash") == expected(stage, cfg).digest
    except StageError:
        return False


def prepare(stage: Stage, cfg, downstream: tuple[str, ...]) -> Optional[StageRun]:
    """Check inputs and the marker. None means the stage is up to date and is skipped."""
    now = expected(stage, cfg)
    inputs, config, digest = now.inputs, now.config, now.digest
    final_dir = stage_dir(cfg, stage.name)

    marker = read_marker(final_dir)
    if marker is not None and marker.get("config_hash") == digest:
        log.info(
            "Skipping %s for %s: it is up to date (config hash %s, finished %s). "
            "Change its config or delete %s to run it again.",
            stage.name, cfg.lang.code, digest, marker.get("finished_at"), final_dir,
        )
        return None
    if marker is not None:
        log.info("%s for %s changed (config hash %s -> %s); running it again.",
                 stage.name, cfg.lang.code, marker.get("config_hash"), digest)

    invalidate(cfg, downstream)
    work_dir = final_dir.with_name(f".{stage.name}.partial-{digest}")
    for stale in final_dir.parent.glob(f".{stage.name}.partial-*"):
        if stale != work_dir:
            log.info("Removing the partial output of an earlier, different run: %s", stale)
            shutil.rmtree(stale, ignore_errors=True)
    if work_dir.exists():
        log.info("Resuming the interrupted run in %s", work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    return StageRun(
        stage=stage.name, lang=cfg.lang.code, cfg=cfg, config_hash=digest, inputs=inputs,
        hashed_config=config, work_dir=work_dir, final_dir=final_dir, upstream=now.upstream,
    )


def invalidate(cfg, stages: tuple[str, ...]) -> None:
    """Remove the markers of later stages: their inputs are about to change."""
    for later in stages:
        marker = stage_dir(cfg, later) / MARKER
        if marker.exists():
            marker.unlink()
            log.info("Invalidated %s for %s (its input changes); it will run again.", later, cfg.lang.code)


def execute(stage: Stage, cfg, downstream: tuple[str, ...] = ()) -> Optional[dict]:
    """Run one stage under the contract. Returns its marker, or None if it went to Slurm."""
    run = prepare(stage, cfg, downstream)
    if run is None:
        return read_marker(stage_dir(cfg, stage.name))
    log.info("Running %s for %s (config hash %s) in %s", stage.name, run.lang, run.config_hash, run.work_dir)
    metrics = stage.run(run)
    if metrics is not None:
        return run.commit(metrics)
    marker = read_marker(run.final_dir)
    return marker if marker is not None and marker["config_hash"] == run.config_hash else None
