"""The stage contract: where a stage writes, when it may be skipped, and how its output appears.

Every stage writes under `${work_dir}/${lang}/<stage>/` and ends with `_SUCCESS.json`, whose
`config_hash` covers the stage's own config sections and the hashes of its inputs. A stage whose
marker matches is skipped; a stage that reruns first removes the markers of the stages after it.
Work happens in a partial folder named after the config hash (so an interrupted run with the same
config resumes there) and is renamed into place only when complete: a killed stage never leaves a
folder that looks finished. A partial folder of another config is continued when only the keys the
stage declares resumable changed (pretrain's step budget), removed when it holds nothing a run could
continue from, and otherwise kept: the run refuses, naming the keys that differ (`resume=never`
moves it aside). A stage runs under a lock (pipeline/stage_lock.py): one run per (work_dir, lang,
stage) at a time.

Hashes never depend on where the work folder is: earlier stages enter by their own hashes, and paths
inside the work folder are recorded relative to it (`portable_path`), so a moved or copied work
folder stays current.

A named run (`run=<name>`) works in folders of its own (pipeline/run_folders.py); a stage of it
whose hash is that of a finished output of another run links to that output instead of running,
and its invalidation removes its own links and markers, never another run's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypeVar

from omegaconf import OmegaConf

from pipeline.commit_steps import commit_step
from pipeline.config_keys import differences, drop, matches_any
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
from pipeline.run_folders import current_marker, matching_output, share, unshare
from pipeline.stage_lock import stage_lock
from pipeline.work_folder import DEFAULT_RUN, MARKER, OutputFile, read_marker, stage_dir

log = logging.getLogger(__name__)
T = TypeVar("T")


class StageOutputHandle(Protocol):
    """What `StageRun.output` makes: a handle to a stage's output folder
    (pipeline/stage_outputs.py)."""

    stage: str

    def __init__(self, folder: Path) -> None: ...


H = TypeVar("H", bound=StageOutputHandle)

# Where a stage runs on a cluster: a job on the CPU partition; one process on one GPU; or
# parallel.tp x pp x dp training ranks, one per GPU, that the stage starts with srun inside its
# allocation (pipeline/training/).
ON_CPU, ON_ONE_GPU, ON_RANKS = "cpu", "one GPU", "ranks"
# In a partial folder: the config hash, hashed config and inputs of the run that works there.
PARTIAL_RECORD = "_PARTIAL.json"


@dataclass(frozen=True)
class Stage:
    name: str
    # `run_<stage>(run)`: does the work in `StageRun.work_dir` and returns the metrics for the
    # contract to commit, or None when it calls `StageRun.commit` itself (clean does, so that the
    # same step can end a Slurm chain).
    run: Callable[["StageRun"], Optional[dict]]
    # Stages whose outputs this one always reads.
    needs: tuple[str, ...] = ()
    # Stages whose outputs this one reads under some configs (pretrain init=warmup reads warmup's).
    needs_when: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    # Stages whose outputs this one reads when they are done, and goes without otherwise (evaluate's
    # models).
    reads_if_done: tuple[str, ...] = ()
    # Added to the message that names missing inputs: the other ways to run this stage.
    hint: str = ""
    # Top-level config sections that change this stage's output (hashed).
    config_sections: tuple[str, ...] = ()
    # Keys inside those sections that do not change the output (parallelism, not results); dotted,
    # `*` for any list index (pipeline/config_keys.py).
    unhashed_keys: tuple[str, ...] = ()
    # Keys that change the output but may change while an interrupted run is continued in its
    # partial folder (pretrain's step budget): such a run goes on under the new values.
    resumable_keys: tuple[str, ...] = ()
    # Further conditions on continuing the partial folder (given) under `cfg`; returns what stands
    # in the way.
    check_resume: Callable[[Path, Any], list[str]] = lambda folder, cfg: []
    # What an interrupted run left in its partial folder that a run continues from ("checkpoints
    # step-4, step-8"); empty: nothing, and a partial folder of another config is removed instead of
    # refusing the run.
    kept_state: Callable[[Path], str] = lambda folder: ""
    # Describes external inputs (e.g. a fingerprint of the raw files); hashed too.
    describe_inputs: Callable[[Any], dict] = lambda cfg: {}
    # Where stage=workflow runs it under `cfg`: ON_CPU, ON_ONE_GPU or ON_RANKS (below).
    placement: Callable[[Any], str] = lambda cfg: ON_CPU
    # What the work folder holds while the stage runs and its output does not keep (pretrain's
    # resumable checkpoints): removed once the marker is written, so that a run killed before then
    # still has it.
    scratch: tuple[str, ...] = ()


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
    # Stage.scratch
    scratch: tuple[str, ...] = ()

    def input(self, stage: str) -> Path:
        """The finished output folder of an earlier stage that this stage declares it reads."""
        if stage not in self.upstream:
            raise StageError(
                f"stage `{self.stage}` reads the output of `{stage}`, which it does not declare or "
                f"which is not done; this is a bug, please report it."
            )
        return self.upstream[stage]

    def has_input(self, stage: str) -> bool:
        return stage in self.upstream

    def output(self, handle: type[H]) -> H:
        """The typed handle (pipeline/stage_outputs.py: `run.output(MixOutput).plan`) to the
        finished output of an earlier stage that this stage declares it reads."""
        return handle(self.input(handle.stage))

    def output_if_done(self, handle: type[H]) -> Optional[H]:
        """`output`, for a stage this one reads when it is done (Stage.reads_if_done); None when it
        is not."""
        return self.output(handle) if self.has_input(handle.stage) else None

    def input_file(self, file: OutputFile) -> Path:
        """A file of an earlier stage's output, which must be there since that stage finished."""
        stage = self._written_by(file.path)
        if not file.path.exists():
            raise self._damaged(stage, file.path, "it is missing")
        return file.path

    def read_input(self, file: OutputFile[T]) -> T:
        """`file.read(path)` of a file of an earlier stage's output; a damaged file (truncated by a
        full disk, a copy cut short) fails naming the file and the stage that made it, instead of a
        bare parser error."""
        path = self.input_file(file)
        try:
            return file.read(path)
        except (
            Exception
        ) as error:  # each reader fails its own way: JSON, tokenizers, safetensors, numpy
            raise self._damaged(
                self._written_by(path), path, f"it cannot be read: {error}"
            ) from None

    def _written_by(self, path: Path) -> str:
        """The earlier stage whose output folder holds `path`."""
        for stage, folder in self.upstream.items():
            if Path(path).is_relative_to(folder):
                return stage
        raise StageError(
            f"stage `{self.stage}` reads {path}, which is in no output of a stage it declares; "
            "this is "
            f"a bug, please report it."
        )

    def _damaged(self, stage: str, path: Path, what: str) -> StageError:
        # The contract skips a stage whose marker matches, whatever its files look like: the marker
        # must go.
        return StageError(
            f"{self.stage} {self.lang}: {path}, written by the {stage} stage, is damaged ({what}). "
            f"Make it again: delete {self.upstream[stage] / MARKER} and run "
            f"{stage_command(stage, self.cfg)}"
        )

    def commit(self, metrics: dict) -> dict:
        """Write the marker into the finished work folder, then move the folder into place
        (`publish`)."""
        marker = {
            "stage": self.stage,
            "lang": self.lang,
            "config_hash": self.config_hash,
            "inputs": self.inputs,
            "metrics": metrics,
            "config": self.hashed_config,
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        commit_step(f"{self.stage}: write the marker")
        write_json_atomic(self.work_dir / MARKER, marker)
        return self.publish(marker)

    def publish(self, marker: dict) -> dict:
        """Move the work folder, whose marker is written, into place. Every step may be taken again:
        a run killed on the way is finished by the same command (`execute`), from the marker,
        without doing the work again."""
        if self.scratch:
            commit_step(f"{self.stage}: remove {', '.join(self.scratch)}")
        for name in self.scratch:
            remove(self.work_dir / name)
        (self.work_dir / PARTIAL_RECORD).unlink(missing_ok=True)
        if self.final_dir.is_symlink():  # a named run's link to the output of its old config
            unshare(self.final_dir)
        old = replaced_dir(self.final_dir)
        if self.final_dir.exists():
            commit_step(f"{self.stage}: set the old output aside")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.final_dir, old)
        commit_step(f"{self.stage}: move the output into place")
        os.replace(self.work_dir, self.final_dir)
        if old.exists():
            commit_step(f"{self.stage}: remove the old output")
            shutil.rmtree(old, ignore_errors=True)
        log.info("%s for %s finished: %s", self.stage, self.lang, self.final_dir / MARKER)
        return marker


def replaced_dir(final_dir: Path) -> Path:
    """Where the output a run replaces waits until the new one is in place."""
    return final_dir.with_name(f".{final_dir.name}.replaced")


def remove(path: Path) -> None:
    """Remove a file or a folder that may be gone already (a step taken again)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def hashed_config(stage: Stage, cfg) -> dict:
    sections = {}
    for name in stage.config_sections:
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            value = OmegaConf.to_container(OmegaConf.structured(value), resolve=True)
        sections[name] = value
    for pattern in stage.unhashed_keys:
        drop(sections, pattern)
    return sections


def config_hash(stage: Stage, config: dict, inputs: dict) -> str:
    payload = json.dumps(
        {"stage": stage.name, "config": config, "inputs": inputs}, sort_keys=True, default=str
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def stage_command(stage: str, cfg) -> str:
    """The command that runs `stage` for cfg's language with the user's own overrides (raw_dir=,
    model.base= ...), as a shell takes it: for the commands that errors suggest."""
    from hydra.core.hydra_config import (
        HydraConfig,
    )  # set while a command runs; not when code calls a stage

    overrides = (
        list(HydraConfig.get().overrides.task)
        if HydraConfig.initialized()
        else [f"work_dir={cfg.work_dir}"]
    )
    kept = [
        o
        for o in overrides
        if o.split("=", 1)[0].lstrip("+~") not in ("stage", "lang", "langs", "base_shape", "run")
    ]
    # The run as resolved: a multirun's name comes from an interpolation (pipeline/overrides.py).
    run = [f"run={cfg.run}"] if cfg.run != DEFAULT_RUN else []
    return shlex.join(
        ["python", "-m", "pipeline", f"stage={stage}", f"lang={cfg.lang.code}", *kept, *run]
    )


@dataclass(frozen=True)
class Expected:
    """What a run of the stage would be now: its inputs, hashed config and their hash."""

    upstream: dict[str, Path]
    inputs: dict
    config: dict
    digest: str


def expected(stage: Stage, cfg) -> Expected:
    """Read the inputs' markers and hash the config; no side effects. Raises StageError naming every
    missing input at once, with the commands that make them."""
    needed = tuple(dict.fromkeys((*stage.needs, *stage.needs_when(cfg))))
    markers = {
        name: current_marker(stage_dir(cfg, name)) for name in (*needed, *stage.reads_if_done)
    }
    missing = [name for name in needed if markers[name] is None]
    if missing:
        commands = "; ".join(stage_command(name, cfg) for name in missing)
        names = ", ".join(f"`{name}`" for name in missing)
        raise StageError(
            f"Stage `{stage.name}` for {cfg.lang.code} needs the output of "
            f"stage{'s' * (len(missing) > 1)} "
            f"{names}, not done yet (no {MARKER} in "
            f"{', '.join(str(stage_dir(cfg, name)) for name in missing)}). Run first: {commands}."
            f"{' ' + stage.hint if stage.hint else ''}"
        )
    done = {name: marker for name, marker in markers.items() if marker is not None}
    upstream = {name: stage_dir(cfg, name) for name in done}
    # Earlier outputs enter the hash by their own hashes, not their paths: a moved work folder stays
    # current.
    inputs = {
        **stage.describe_inputs(cfg),
        **{name: {"config_hash": marker["config_hash"]} for name, marker in done.items()},
    }
    config = hashed_config(stage, cfg)
    return Expected(
        upstream=upstream, inputs=inputs, config=config, digest=config_hash(stage, config, inputs)
    )


def is_current(stage: Stage, cfg) -> bool:
    """Whether the stage's marker matches what a run would produce now (stage=workflow asks before
    submitting).

    Unlike `prepare`, it changes nothing: no invalidation, no partial folder. A missing input (or
    one that cannot be described yet) means the stage is not current.
    """
    marker = current_marker(stage_dir(cfg, stage.name))
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

    marker = current_marker(final_dir)
    if marker is not None and marker.get("config_hash") == digest:
        log.info(
            "Skipping %s for %s: it is up to date (config hash %s, finished %s). "
            "Change its config or delete %s to run it again.",
            stage.name,
            cfg.lang.code,
            digest,
            marker.get("finished_at"),
            final_dir,
        )
        return None
    if _shares_an_output(stage, cfg, final_dir, digest, downstream):
        return None
    if marker is not None:
        log.info(
            "%s for %s changed (config hash %s -> %s); running it again.",
            stage.name,
            cfg.lang.code,
            marker.get("config_hash"),
            digest,
        )

    work_dir = final_dir.with_name(f".{stage.name}.partial-{digest}")
    # Before anything changes: a refusal leaves the work folder as it was.
    _settle_partials(stage, cfg, now, work_dir)
    invalidate(cfg, downstream)
    if work_dir.exists():
        log.info("Resuming the interrupted run in %s", work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        work_dir / PARTIAL_RECORD, {"config_hash": digest, "config": config, "inputs": inputs}
    )
    return StageRun(
        stage=stage.name,
        lang=cfg.lang.code,
        cfg=cfg,
        config_hash=digest,
        inputs=inputs,
        hashed_config=config,
        work_dir=work_dir,
        final_dir=final_dir,
        upstream=now.upstream,
        scratch=stage.scratch,
    )


def _shares_an_output(
    stage: Stage, cfg, final_dir: Path, digest: str, downstream: tuple[str, ...]
) -> bool:
    """A named run's stage whose hash is that of another run's finished output links to it instead
    of running (pipeline/run_folders.py); its own output of another config is replaced, as a run of
    the stage would replace it. Returns whether it did."""
    if cfg.run == DEFAULT_RUN:
        return False
    shared = matching_output(cfg.work_dir, cfg.lang.code, cfg.run, stage.name, digest)
    if shared is None:
        return False
    invalidate(cfg, downstream)
    old = replaced_dir(final_dir)
    if final_dir.is_dir() and not final_dir.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final_dir, old)
    share(final_dir, shared, digest)
    shutil.rmtree(old, ignore_errors=True)
    log.info(
        "%s for %s in run %s: the output of the same config (hash %s) is in %s; the run reads it "
        "there (%s links to it).",
        stage.name,
        cfg.lang.code,
        cfg.run,
        digest,
        shared,
        final_dir,
    )
    return True


def _settle_partials(stage: Stage, cfg, now: Expected, work_dir: Path) -> None:
    """Decide the fate of the partial folders of interrupted runs before this run starts in
    `work_dir`.

    `resume=never` moves every one aside. Otherwise the partial folder of another config is
    continued (renamed to `work_dir`) when only the stage's resumable keys differ and its own check
    agrees; removed when it holds nothing a run continues from; else the run is refused, naming the
    keys that differ, and nothing changes.
    """
    what = f"{stage.name} for {cfg.lang.code}"
    partials = sorted(
        path for path in work_dir.parent.glob(f".{stage.name}.partial-*") if path.is_dir()
    )
    if cfg.resume == "never":
        _set_aside(stage, what, partials)
        return
    refusals, restore = [], {}
    for partial in partials:
        if partial == work_dir:
            continue
        refused = _settle_partial(stage, cfg, now, work_dir, partial, what)
        if refused is not None:
            refusals.append(refused[0])
            restore.update(refused[1])
    if refusals:
        raise _kept_partials_error(stage, what, refusals, restore)


def _set_aside(stage: Stage, what: str, partials: list[Path]) -> None:
    """resume=never: move each partial folder aside, for the user to delete once it is no longer
    needed."""
    for partial in partials:
        moment = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        aside = partial.with_name(
            f".{stage.name}.set-aside-{moment}-{partial.name.rsplit('-', 1)[1]}"
        )
        os.replace(partial, aside)
        log.warning(
            "resume=never: the interrupted run of %s in %s is moved aside to %s and the stage "
            "starts "
            "again; delete that folder when you no longer need it.",
            what,
            partial,
            aside,
        )


def _settle_partial(
    stage: Stage, cfg, now: Expected, work_dir: Path, partial: Path, what: str
) -> Optional[tuple[str, dict[str, Any]]]:
    """Continue the partial folder of another config `partial` in `work_dir`, or remove it where it
    holds nothing to continue from. Otherwise returns why it stops this run, and the values it ran
    with of the keys that cannot change (for the message: run with them to continue it)."""
    changed = _changed_keys(partial, now)
    fixed = {
        key: values for key, values in changed.items() if not matches_any(key, stage.resumable_keys)
    }
    problems = [] if fixed else stage.check_resume(partial, cfg)
    if not fixed and not problems and not work_dir.exists():
        os.replace(partial, work_dir)
        log.info(
            "Continuing the interrupted run of %s from %s, with %s",
            what,
            partial,
            _listed(changed),
        )
        return None
    kept = stage.kept_state(partial)
    if not kept:
        log.info(
            "Removing the partial output of an earlier, different run of %s: %s (it holds "
            "nothing a run "
            "continues from)",
            what,
            partial,
        )
        shutil.rmtree(partial, ignore_errors=True)
        return None
    reasons, restore = [f"it ran with {_listed(changed)}"], {}
    if fixed:
        reasons.append(f"{', '.join(fixed)} cannot change while it is continued")
        restore = {key: old for key, (old, _) in fixed.items() if key.split(".")[0] in now.config}
    elif not problems:
        reasons.append(f"a partial folder of this very config exists too ({work_dir})")
    return f"{partial} holds {kept}; {'; '.join(reasons + problems)}", restore


def _kept_partials_error(
    stage: Stage, what: str, refusals: list[str], restore: dict[str, Any]
) -> StageError:
    """Why the run is refused, and its two ways on: continue the kept run with its values
    (`restore`), or set it aside with resume=never."""
    values = " ".join(f"{key}={old}" for key, old in restore.items())
    resumable = (
        f"; these may change: {', '.join(stage.resumable_keys)}" if stage.resumable_keys else ""
    )
    return StageError(
        f"{what}: an interrupted run of another configuration is kept, not deleted: "
        f"{' | '.join(refusals)}. "
        "Either continue it: run with its values "
        f"again{f' ({values})' if values else ''}{resumable}. Or start "
        "again: add resume=never, which moves it aside to "
        f".{stage.name}.set-aside-<time>-<hash>/ (delete that "
        f"folder yourself once you no longer need it)."
    )


def _changed_keys(partial: Path, now: Expected) -> dict[str, tuple]:
    """What differs between the run recorded in `partial` and this one: config keys, and
    `inputs.<name>...`."""
    try:
        recorded = json.loads((partial / PARTIAL_RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {"(unrecorded configuration)": ("?", "this run's")}
    changed = differences(recorded.get("config"), now.config)
    changed.update(
        {
            f"inputs.{key}": values
            for key, values in differences(recorded.get("inputs"), now.inputs).items()
        }
    )
    return changed


def _listed(changed: dict[str, tuple]) -> str:
    return (
        ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changed.items())
        or "no key changed"
    )


def invalidate(cfg, stages: tuple[str, ...]) -> None:
    """Remove the markers of later stages: their inputs are about to change. A named run's link to
    another run's output goes instead: that output is not this run's to invalidate."""
    for later in stages:
        folder = stage_dir(cfg, later)
        if folder.is_symlink():
            unshare(folder)
            log.info(
                "%s for %s in run %s no longer shares %s (its input changes); it will run again.",
                later,
                cfg.lang.code,
                cfg.run,
                folder.resolve(),
            )
            continue
        marker = folder / MARKER
        if marker.exists():
            marker.unlink()
            log.info(
                "Invalidated %s for %s (its input changes); it will run again.",
                later,
                cfg.lang.code,
            )


def share_if_done(stage: Stage, cfg, downstream: tuple[str, ...] = ()) -> None:
    """For a named run about to run a later stage: link its `stage` to another run's finished
    output of the same config, as `prepare` would, without running anything; so that a sweep run
    one stage at a time finds the outputs it shares. Nothing changes for the default run, for a
    finished output the run has (its own, or a link still valid), or when the stage's inputs are
    not done."""
    final_dir = stage_dir(cfg, stage.name)
    if cfg.run == DEFAULT_RUN or current_marker(final_dir) is not None:
        return
    try:
        digest = expected(stage, cfg).digest
    except StageError:
        return
    if matching_output(cfg.work_dir, cfg.lang.code, cfg.run, stage.name, digest) is None:
        return
    with stage_lock(final_dir, f"stage {stage.name} for {cfg.lang.code}"):
        _shares_an_output(stage, cfg, final_dir, digest, downstream)


def execute(stage: Stage, cfg, downstream: tuple[str, ...] = ()) -> Optional[dict]:
    """Run one stage under the contract and its lock. Returns its marker, or None if it went to
    Slurm."""
    final_dir = stage_dir(cfg, stage.name)
    with stage_lock(final_dir, f"stage {stage.name} for {cfg.lang.code}"):
        # An output replaced by a run killed before it could remove it.
        shutil.rmtree(replaced_dir(final_dir), ignore_errors=True)
        run = prepare(stage, cfg, downstream)
        if run is None:
            return read_marker(final_dir)
        finished = read_marker(run.work_dir)
        if finished is not None and finished.get("config_hash") == run.config_hash:
            log.info(
                "The interrupted run of %s for %s in %s had finished its work; moving its output "
                "into place.",
                stage.name,
                run.lang,
                run.work_dir,
            )
            return run.publish(finished)
        log.info(
            "Running %s for %s (config hash %s) in %s",
            stage.name,
            run.lang,
            run.config_hash,
            run.work_dir,
        )
        metrics = stage.run(run)
        if metrics is not None:
            return run.commit(metrics)
    marker = read_marker(run.final_dir)
    return marker if marker is not None and marker["config_hash"] == run.config_hash else None
