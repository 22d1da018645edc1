"""The command line as users meet it: help, resolved config, and errors that say what to do."""

from __future__ import annotations

import pytest

from pipeline.stages import STAGE_NAMES
from tests.conftest import run_cli


def test_help_lists_every_stage_and_the_main_options(tmp_path):
    out = run_cli("--help", cwd=tmp_path).stdout
    for stage in (*STAGE_NAMES, "all"):
        assert f"\n  {stage} " in out
    for option in ("work_dir=", "raw_dir=", "workers=", "cluster=", "clean.lid.model=", "--cfg job"):
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


def test_unknown_stage_lists_choices_closest_first(tmp_path):
    result = run_cli("stage=claen", "lang=nob", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "Unknown stage `stage=claen`. Valid stages, closest first: clean," in result.stderr


def test_misspelled_override_names_the_key_and_the_fix(tmp_path):
    result = run_cli("stage=clean", "lang=nob", "clean.heldout_fracton=0.1", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "Unknown config key `clean.heldout_fracton`. Did you mean: `clean.heldout_fraction`" in result.stderr


def test_mistyped_value_names_the_key(tmp_path):
    result = run_cli("stage=clean", "lang=nob", "clean.heldout_fraction=abc", cwd=tmp_path, check=False)
    assert result.returncode != 0
    assert "clean.heldout_fraction" in result.stderr


def test_out_of_range_value_names_the_key_and_the_allowed_values(tmp_path):
    result = run_cli("stage=clean", "lang=nob", "clean.heldout_fraction=1.5", cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert "Invalid value for `clean.heldout_fraction`: 1.5. Allowed: a number in [0, 1)" in result.stderr


def test_missing_lang_says_what_to_give(tmp_path):
    result = run_cli("stage=clean", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "Missing `lang=`" in result.stderr


def test_missing_lid_model_file_names_the_key(tmp_path):
    result = run_cli("stage=clean", "lang=nob", "clean.lid.model=/nonexistent/lid.bin", cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert "clean.lid.model" in result.stderr and "/nonexistent/lid.bin" in result.stderr
