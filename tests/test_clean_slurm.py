"""The clean stage as Slurm jobs (datatrove's Slurm executor) on a real one-node Slurm cluster, and the values that
would reach its batch scripts refused before anything is submitted."""

from __future__ import annotations

import time

import pytest

from tests.conftest import marker, read_jsonl_gz, run_cli


def _wait_for_marker(path, seconds: int = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} after {seconds} s; see the Slurm logs under its logs/"
        time.sleep(2)


def test_clean_on_slurm_matches_the_local_run(tmp_path, slurm_cluster):
    slurm = run_cli("stage=clean", "lang=fao", "work_dir=slurm", "cluster.executor=slurm",
                    f"cluster.partition={slurm_cluster}", cwd=tmp_path)
    assert "submitted to Slurm" in slurm.stderr + slurm.stdout
    _wait_for_marker(tmp_path / "slurm" / "fao" / "clean" / "_SUCCESS.json")
    run_cli("stage=clean", "lang=fao", "work_dir=local", cwd=tmp_path)

    on_slurm, local = marker(tmp_path / "slurm", "fao", "clean"), marker(tmp_path / "local", "fao", "clean")
    assert on_slurm["config_hash"] == local["config_hash"]
    assert on_slurm["metrics"] == local["metrics"]
    ids = {where: sorted(r["id"] for r in read_jsonl_gz(tmp_path / where / "fao" / "clean" / "train"))
           for where in ("slurm", "local")}
    assert ids["slurm"] == ids["local"]

    again = run_cli("stage=clean", "lang=fao", "work_dir=slurm", "cluster.executor=slurm",
                    f"cluster.partition={slurm_cluster}", cwd=tmp_path)
    assert "Skipping clean for fao" in again.stderr + again.stdout


@pytest.mark.parametrize("work_dir", ["runs/a$(touch pwned)b", "runs/a`touch pwned`b", "runs/with space"])
def test_a_work_dir_that_would_be_shell_syntax_in_the_batch_script_is_refused_before_submitting(tmp_path, work_dir):
    # datatrove writes its folders unquoted into the sbatch script; no Slurm is needed to see the refusal.
    result = run_cli("stage=clean", "lang=fao", f"work_dir='{work_dir}'", "cluster.executor=slurm", cwd=tmp_path,
                     check=False)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Invalid value for `work_dir`" in result.stderr and "unquoted into its batch script" in result.stderr
    assert not (tmp_path / "pwned").exists()
    assert not list(tmp_path.rglob("executor.pik")) and not list(tmp_path.rglob("launch_script.slurm"))


def test_sbatch_values_are_single_tokens(tmp_path):
    result = run_cli("stage=clean", "lang=fao", "cluster.executor=slurm", "+cluster.sbatch_args.comment='a b'",
                     cwd=tmp_path, check=False)
    assert result.returncode == 1 and "Invalid value for `cluster.sbatch_args.comment`" in result.stderr
