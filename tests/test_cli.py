"""The command line as users meet it: help, resolved config, and errors that say what to do."""

from __future__ import annotations

import pytest

from pipeline.targets import TARGETS
from tests.conftest import run_cli


def test_help_lists_every_stage_and_the_main_options(tmp_path):
    out = run_cli("--help", cwd=tmp_path).stdout
    for stage in TARGETS:
        assert f"\n  {stage} " in out
    for option in ("work_dir=", "raw_dir=", "workers=", "cluster=", "clean.lid.model=", "mix.tokens=", "--cfg job"):
        assert option in out


def test_cfg_job_prints_the_resolved_config_with_the_language_entry(tmp_path):
    out = run_cli("--cfg", "job", "stage=clean", "lang=nb", cwd=tmp_path).stdout
    assert "stage: clean" in out
    assert "code: nob" in out and "language_score: 0.813" in out and "line_punct_thr: 0.2" in out
    assert not (tmp_path / "work").exists()  # printing the config does no work


@pytest.mark.parametrize("typed, first", [("xyz", None), ("nbo", "nob"), ("fra_Latn", "fra")])
def test_unknown_or_aliased_language(tmp_path, typed, first):
    result = run_cli("stage=clean", f"lang={typed}", "--cfg", "job", cwd=tmp_path, check=False)
    if typed == "fra_Latn":  # an alias of a known language resolves
        assert result.returncode == 0 and "code: fra" in result.stdout
        return
    assert result.returncode == 2
    assert f"Unknown language `lang={typed}`" in result.stderr
    assert "languages.yaml" in result.stderr
    if first:
        assert result.stderr.split("Closest known codes: ")[1].startswith(first)


@pytest.mark.parametrize("args, code, message", [
    (["stage=claen", "lang=nob"], 2, "Unknown stage `stage=claen`. Valid stages, closest first: clean,"),
    (["stage=clean", "lang=nob", "clean.heldout_fracton=0.1"], 2,
     "Unknown config key `clean.heldout_fracton`. Did you mean: `clean.heldout_fraction`"),
    (["stage=clean", "lang=nob", "clean.heldout_fraction=abc"], 1, "clean.heldout_fraction"),
    (["stage=clean", "lang=nob", "clean.heldout_fraction=1.5"], 1,
     "Invalid value for `clean.heldout_fraction`: 1.5. Allowed: a number in [0, 1)"),
    (["stage=clean"], 2, "Missing `lang=`"),
], ids=["stage", "key", "type", "range", "missing-lang"])
def test_mistakes_fail_at_once_naming_the_key_and_the_fix(tmp_path, args, code, message):
    result = run_cli(*args, cwd=tmp_path, check=False)
    assert result.returncode == code
    assert message in result.stderr
    assert not (tmp_path / "work" / "nob" / "clean").exists()


def test_missing_lid_model_file_names_the_key(tmp_path):
    result = run_cli("stage=clean", "lang=nob", "clean.lid.model=/nonexistent/lid.bin", cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert "clean.lid.model" in result.stderr and "/nonexistent/lid.bin" in result.stderr
