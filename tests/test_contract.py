"""The stage contract on toy stages: markers, skipping, invalidation, atomic output, missing inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pipeline.contract import MARKER, Stage, execute, read_marker
from pipeline.errors import StageError


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
    assert second["inputs"]["first"]["config_hash"] == read_marker(tmp_path / "nob" / "first")["config_hash"]
    cfg.first.size = 2
    execute(FIRST, cfg, downstream=("second",))
    assert not (tmp_path / "nob" / "second" / MARKER).exists()
    rerun = execute(SECOND, cfg)
    assert rerun["metrics"] == {"chars": 2} and rerun["config_hash"] != second["config_hash"]
    assert calls == ["first", "second", "first", "second"]


def test_missing_input_names_the_stage_to_run_first(cfg):
    with pytest.raises(StageError, match=r"needs the output of stage `first`.*python -m pipeline stage=first lang=nob"):
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
    assert not list((tmp_path / "nob").glob(".first.*"))
