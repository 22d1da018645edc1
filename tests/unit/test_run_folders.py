"""Named runs on toy stages: their names, the outputs they share by config hash (links), what they
write (their own folders only), and what happens when a shared output changes under them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from pipeline.contract import Stage, execute, is_current, share_if_done
from pipeline.errors import ConfigError
from pipeline.overrides import OverrideError, preflight
from pipeline.run_folders import check_run_name, current_marker, swept_run_name
from pipeline.work_folder import MARKER, read_marker


@dataclass
class ToyLang:
    code: str = "nob"


@dataclass
class ToySection:
    size: int = 1


@dataclass
class ToyConfig:
    work_dir: str
    run: str = "default"
    lang: ToyLang = field(default_factory=ToyLang)
    resume: str = "auto"
    first: ToySection = field(default_factory=ToySection)
    second: ToySection = field(default_factory=ToySection)


calls: list[tuple[str, str]] = []


def _first(run):
    calls.append((run.cfg.run, "first"))
    (run.work_dir / "out.txt").write_text("x" * run.cfg.first.size)
    return {"size": run.cfg.first.size}


def _second(run):
    calls.append((run.cfg.run, "second"))
    upstream = (run.input("first") / "out.txt").read_text()
    (run.work_dir / "out.txt").write_text(upstream.upper() * run.cfg.second.size)
    return {"chars": len(upstream)}


FIRST = Stage("first", _first, config_sections=("first",))
SECOND = Stage("second", _second, needs=("first",), config_sections=("second",))


def chain(cfg) -> None:
    execute(FIRST, cfg, downstream=("second",))
    execute(SECOND, cfg)


@pytest.fixture
def work(tmp_path):
    calls.clear()
    return tmp_path


def test_a_named_run_of_the_same_config_links_to_the_outputs_and_runs_nothing(work):
    default = ToyConfig(str(work))
    chain(default)
    named = replace(default, run="lr-3e-4")
    chain(named)
    assert calls == [("default", "first"), ("default", "second")]
    folder = work / "nob" / "runs" / "lr-3e-4"
    for stage in ("first", "second"):
        assert (folder / stage).is_symlink() and (folder / stage).resolve() == work / "nob" / stage
    assert (folder / "second" / "out.txt").read_text() == "X"


def test_a_run_whose_config_differs_writes_its_own_folders_and_shares_the_rest(work):
    chain(ToyConfig(str(work)))
    other = ToyConfig(str(work), run="bigger", second=ToySection(size=3))
    chain(other)
    assert calls[-1] == ("bigger", "second")
    own = work / "nob" / "runs" / "bigger"
    assert (own / "first").is_symlink() and not (own / "second").is_symlink()
    assert (own / "second" / "out.txt").read_text() == "XXX"
    assert (work / "nob" / "second" / "out.txt").read_text() == "X"  # the default's, untouched
    # A third run of that config shares the named run's output, not the default's.
    third = replace(other, run="bigger-again")
    chain(third)
    assert calls[-1] == ("bigger", "second")
    assert (work / "nob" / "runs" / "bigger-again" / "second").resolve() == own / "second"


def test_a_run_invalidates_its_links_never_the_outputs_they_share(work):
    default = ToyConfig(str(work))
    chain(default)
    named = replace(default, run="r")
    chain(named)
    execute(FIRST, replace(named, first=ToySection(size=2)), downstream=("second",))
    assert not (work / "nob" / "runs" / "r" / "second").exists()  # its link went
    assert read_marker(work / "nob" / "second") is not None  # the default's output stays done
    assert is_current(SECOND, default)


def test_a_shared_output_that_its_owner_replaces_counts_as_not_done(work):
    default = ToyConfig(str(work))
    chain(default)
    named = replace(default, run="r")
    chain(named)
    changed = replace(default, first=ToySection(size=5))
    execute(FIRST, changed, downstream=("second",))  # the default run replaces its output
    link = work / "nob" / "runs" / "r" / "first"
    assert read_marker(link) is not None and current_marker(link) is None
    assert not is_current(FIRST, named)
    calls.clear()
    chain(named)  # runs again in folders of its own: nothing of that config is left elsewhere
    assert calls == [("r", "first"), ("r", "second")]
    assert not link.is_symlink() and (link / "out.txt").read_text() == "x"
    assert (work / "nob" / "first" / "out.txt").read_text() == "xxxxx"


def test_a_later_stage_run_alone_finds_the_earlier_outputs_it_shares(work):
    chain(ToyConfig(str(work)))
    named = ToyConfig(str(work), run="r", second=ToySection(size=2))
    share_if_done(FIRST, named, downstream=("second",))
    execute(SECOND, named)
    assert calls[-1] == ("r", "second")
    assert (work / "nob" / "runs" / "r" / "first").is_symlink()
    assert (work / "nob" / "runs" / "r" / "second" / MARKER).is_file()


@pytest.mark.parametrize(
    "name", ["lr-3e-4", "train.lr-0.0001", "mix.max_epochs-2+train.lr-1", "A_1"]
)
def test_run_names_that_name_a_folder_safely_are_taken(name):
    check_run_name("run", name)


@pytest.mark.parametrize(
    "name", ["a/b", "../x", "a..b", "$(reboot)", "a b", "-x", ".hidden", "all", "x" * 101, ""]
)
def test_run_names_with_separators_dots_or_shell_characters_are_refused_naming_the_key(name):
    with pytest.raises(ConfigError, match="Invalid value for `run`"):
        check_run_name("run", name)


def test_swept_values_become_safe_run_names():
    assert swept_run_name("train.lr=0.0001") == "train.lr-0.0001"
    assert swept_run_name("mix.max_epochs=2,train.lr=0.0001") == "mix.max_epochs-2+train.lr-0.0001"
    for typed in ("model.base=/models/a b/$(x)", "x=../..", "k=" + "v" * 300):
        name = swept_run_name(typed)
        check_run_name("run", name)
    assert swept_run_name("k=" + "v" * 300) != swept_run_name("k=" + "v" * 299 + "w")


def test_a_multirun_names_its_runs_from_the_swept_keys_only():
    argv = preflight(
        ["-m", "stage=pretrain", "lang=nob,nno", "workers=2", "train.lr=1e-3,3e-3"]
    ).argv
    assert "run=${swept_run:}" in argv
    excluded = next(arg for arg in argv if arg.startswith("hydra.job.config.override_dirname"))
    assert excluded.endswith("=[stage,lang,workers,run,scale]")
    # A sweep over the languages alone is the default run of each language, as before.
    assert not any(
        arg.startswith("run=") for arg in preflight(["-m", "stage=clean", "lang=nob,nno"]).argv
    )
    with pytest.raises(OverrideError, match="Leave `run=` out"):
        preflight(["-m", "stage=pretrain", "lang=nob", "run=x", "train.lr=1e-3,3e-3"])
