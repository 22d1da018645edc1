"""Where the evaluate stage of a named run finds the clean text of the base model's language."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.evaluation.texts import base_lang_clean
from pipeline.work_folder import MARKER


@dataclass
class _Model:
    base_lang: str = "eng"


@dataclass
class _Config:
    work_dir: str
    run: str
    lang: object = None
    model: _Model = field(default_factory=_Model)


def test_a_named_run_reads_the_default_runs_english_unless_it_has_its_own(tmp_path):
    """A lone `stage=evaluate run=<name>` has linked nothing of English: the default run's clean
    output is the one every run's mix read."""
    cfg = _Config(str(tmp_path), "train.lr-0.003")
    default = tmp_path / "eng" / "clean"
    own = tmp_path / "eng" / "runs" / "train.lr-0.003" / "clean"
    default.mkdir(parents=True)
    (default / MARKER).write_text("{}")
    assert base_lang_clean(cfg) == default
    own.mkdir(parents=True)
    assert base_lang_clean(cfg) == default  # an unfinished folder of its own is not its text
    (own / MARKER).write_text("{}")
    assert base_lang_clean(cfg) == own
