"""The stage contract on toy stages: markers, skipping, invalidation, atomic output, missing inputs,
interrupted runs under another config, the stage lock, damaged inputs, moved work folders."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

import pipeline.stage_lock
from pipeline.contract import Stage, execute, is_current
from pipeline.errors import StageError
from pipeline.work_folder import MARKER, OutputFile, portable_path, read_marker, resolve_path


@dataclass
class ToyLang:
    code: str = "nob"


@dataclass
class ToySection:
    size: int = 1
    workers: int = 1


@dataclass
class ToyConfig:
    work_dir: str
    lang: ToyLang = field(default_factory=ToyLang)
    run: str = "default"
    resume: str = "auto"
    first: ToySection = field(default_factory=ToySection)
    second: ToySection = field(default_factory=ToySection)


calls: list[str] = []


def _first(run):
    calls.append("first")
    (run.work_dir / "out.txt").write_text("x" * run.cfg.first.size)
    return {"size": run.cfg.first.size}


def _second(run):
    calls.append("second")
    upstream = (run.input("first") / "out.txt").read_text()
    (run.work_dir / "out.txt").write_text(upstream.upper())
    return {"chars": len(upstream)}


FIRST = Stage("first", _first, config_sections=("first",), unhashed_keys=("first.workers",))
SECOND = Stage("second", _second, needs=("first",), config_sections=("second",))


@pytest.fixture
def cfg(tmp_path):
    calls.clear()
    return ToyConfig(work_dir=str(tmp_path))


def test_marker_holds_hash_inputs_and_metrics(cfg, tmp_path):
    execute(FIRST, cfg, downstream=("second",))
    m = read_marker(tmp_path / "nob" / "first")
    assert m["stage"] == "first" and m["lang"] == "nob" and m["metrics"] == {"size": 1}
    assert m["config"] == {"first": {"size": 1}}  # unhashed keys are left out
    assert "finished_at" in m and len(m["config_hash"]) == 16


def test_unchanged_is_skipped_and_changed_reruns(cfg):
    execute(FIRST, cfg)
    execute(FIRST, cfg)
    assert calls == ["first"]
    cfg.first.workers = 8  # parallelism does not change the output
    execute(FIRST, cfg)
    assert calls == ["first"]
    cfg.first.size = 3
    assert execute(FIRST, cfg)["metrics"] == {"size": 3}
    assert calls == ["first", "first"]


def test_rerun_invalidates_later_stages_and_their_hash_follows(cfg, tmp_path):
    execute(FIRST, cfg, downstream=("second",))
    second = execute(SECOND, cfg)
    assert (
        second["inputs"]["first"]["config_hash"]
        == read_marker(tmp_path / "nob" / "first")["config_hash"]
    )
    cfg.first.size = 2
    execute(FIRST, cfg, downstream=("second",))
    assert not (tmp_path / "nob" / "second" / MARKER).exists()
    rerun = execute(SECOND, cfg)
    assert rerun["metrics"] == {"chars": 2} and rerun["config_hash"] != second["config_hash"]
    assert calls == ["first", "second", "first", "second"]


def test_missing_input_names_the_stage_to_run_first(cfg):
    with pytest.raises(
        StageError,
        match=r"needs the output of stage `first`.*python -m pipeline stage=first lang=nob",
    ):
        execute(SECOND, cfg)


def test_failed_stage_leaves_no_output_that_looks_complete(cfg, tmp_path):
    execute(FIRST, cfg)
    good = (tmp_path / "nob" / "first" / "out.txt").read_text()

    def crash(run):
        (run.work_dir / "out.txt").write_text("half")
        raise RuntimeError("killed")

    cfg.first.size = 5
    with pytest.raises(RuntimeError):
        execute(Stage("first", crash, config_sections=("first",)), cfg)
    # the previous complete output and its marker are untouched; the half-written one is a partial
    assert (tmp_path / "nob" / "first" / "out.txt").read_text() == good
    assert read_marker(tmp_path / "nob" / "first")["metrics"] == {"size": 1}
    partials = list((tmp_path / "nob").glob(".first.partial-*"))
    assert len(partials) == 1 and not (partials[0] / MARKER).exists()

    # the next run with the same config resumes in that partial folder and replaces the old output
    resumed = execute(FIRST, cfg)
    assert resumed["metrics"] == {"size": 5}
    assert (tmp_path / "nob" / "first" / "out.txt").read_text() == "x" * 5
    assert not list((tmp_path / "nob").glob(".first.partial-*"))
    assert not list((tmp_path / "nob").glob(".first.replaced-*"))


# -- interrupted runs under another config, the lock, damaged inputs, moved work folders -----------


def _interrupted(run):
    """A stage that leaves state a rerun continues from, then stops (as a killed run would)."""
    calls.append(f"trainer with state {(run.work_dir / 'state.txt').is_file()}")
    if run.cfg.first.workers == 0:  # the toy's way of asking for an interruption
        (run.work_dir / "state.txt").write_text("step 4")
        raise RuntimeError("killed")
    return {"size": run.cfg.first.size}


TRAINER = Stage(
    "trainer",
    _interrupted,
    config_sections=("first",),
    unhashed_keys=("first.workers",),
    resumable_keys=("first.size",),
    check_resume=lambda folder, cfg: [] if cfg.first.size < 9 else ["9"],
    kept_state=lambda folder: "a state file" if (folder / "state.txt").is_file() else "",
)


def _interrupt(cfg):
    cfg.first.workers = 0
    with pytest.raises(RuntimeError):
        execute(TRAINER, cfg)
    cfg.first.workers = 1


def test_a_run_continues_an_interrupted_one_when_only_resumable_keys_changed(cfg, tmp_path, caplog):
    _interrupt(cfg)
    cfg.first.size = 3  # the step budget of a training stage, say
    with caplog.at_level("INFO"):
        assert execute(TRAINER, cfg)["metrics"] == {"size": 3}
    assert calls == ["trainer with state False", "trainer with state True"]
    assert "Continuing the interrupted run" in caplog.text and "first.size 1 -> 3" in caplog.text
    assert (tmp_path / "nob" / "trainer" / "state.txt").is_file()
    assert not list((tmp_path / "nob").glob(".trainer.partial-*"))


def test_another_change_is_refused_naming_the_keys_and_nothing_is_touched(cfg, tmp_path):
    execute(FIRST, cfg, downstream=("trainer",))
    _interrupt(cfg)
    before = sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if ".lock" not in p.name
    )
    cfg.first.size = 9  # resumable, but the stage's own check refuses it
    with pytest.raises(StageError, match=r"first\.size.*9"):
        execute(TRAINER, cfg)
    cfg.second.size = 2
    with pytest.raises(StageError) as refused:
        execute(
            Stage(
                "trainer",
                _interrupted,
                config_sections=("first", "second"),
                resumable_keys=("first.size",),
                kept_state=TRAINER.kept_state,
            ),
            cfg,
        )
    message = str(refused.value)
    assert "a state file" in message and "second" in message and "resume=never" in message
    assert before == sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if ".lock" not in p.name
    )


def test_resume_never_moves_the_interrupted_run_aside_and_starts_again(cfg, tmp_path):
    _interrupt(cfg)
    cfg.resume = "never"
    execute(TRAINER, cfg)
    assert calls[-1] == "trainer with state False"
    (aside,) = (tmp_path / "nob").glob(".trainer.set-aside-*")
    assert (aside / "state.txt").read_text() == "step 4"


def test_a_partial_folder_with_nothing_to_continue_from_is_removed(cfg, tmp_path):
    def crash(run):
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        execute(Stage("first", crash, config_sections=("first",)), cfg)
    cfg.first.size = 2
    execute(FIRST, cfg)
    assert not list((tmp_path / "nob").glob(".first.partial-*"))


def test_a_second_run_of_a_running_stage_is_refused_naming_its_holder(cfg):
    def nested(run):
        with pytest.raises(
            StageError, match=rf"already running.*host {socket.gethostname()}, pid {os.getpid()}"
        ):
            execute(FIRST, run.cfg)
        return {"ok": 1}

    assert execute(Stage("first", nested, config_sections=("first",)), cfg)["metrics"] == {"ok": 1}


def test_the_lock_of_a_dead_run_is_taken_over(cfg, tmp_path, monkeypatch, caplog):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    lock = tmp_path / "nob" / ".first.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(
        json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "started": "earlier"})
    )
    with caplog.at_level("INFO"):
        execute(FIRST, cfg)
    assert "Taking over the lock" in caplog.text and lock.read_text() == ""

    # Without flock (Lustre mounted without -o flock) the recorded holder decides: a live one
    # refuses.
    def no_flock(handle, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(pipeline.stage_lock.fcntl, "flock", no_flock)
    lock.write_text(
        json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "started": "now"})
    )
    cfg.first.size = 2
    with pytest.raises(StageError, match=rf"already running.*pid {os.getppid()}.*not enforced"):
        execute(FIRST, cfg)
    lock.write_text(
        json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "started": "earlier"})
    )
    assert execute(FIRST, cfg)["metrics"] == {"size": 2}


def test_a_damaged_input_names_the_file_and_the_stage_that_made_it(cfg, tmp_path):
    def reads_json(run):
        return run.read_input(
            OutputFile(run.input("first") / "out.txt", lambda path: json.loads(path.read_text()))
        )

    execute(FIRST, cfg)  # out.txt holds "x", which is not JSON
    with pytest.raises(StageError) as damaged:
        execute(Stage("second", reads_json, needs=("first",)), cfg)
    message = str(damaged.value)
    assert (
        str(tmp_path / "nob" / "first" / "out.txt") in message
        and "written by the first stage" in message
    )
    assert "python -m pipeline stage=first lang=nob" in message and MARKER in message


def test_a_moved_work_folder_keeps_its_hashes_and_paths_inside_it_are_relative(cfg, tmp_path):
    execute(FIRST, cfg, downstream=("second",))
    execute(SECOND, cfg)
    shutil.copytree(tmp_path / "nob", tmp_path / "elsewhere" / "nob")
    moved = ToyConfig(work_dir=str(tmp_path / "elsewhere"))
    assert is_current(FIRST, moved) and is_current(SECOND, moved)
    recorded = portable_path(cfg, tmp_path / "nob" / "first")
    assert recorded == "${work_dir}/nob/first"
    assert resolve_path(moved.work_dir, recorded) == tmp_path / "elsewhere" / "nob" / "first"
    assert portable_path(cfg, "/somewhere/else") == "/somewhere/else"
