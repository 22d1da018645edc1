"""The clean stage as Slurm jobs (datatrove's Slurm executor) on a real one-node Slurm cluster, and
the values that would reach its batch scripts refused before anything is submitted."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from pipeline.cluster import ClusterConfig, check_script_word, validate_cluster
from pipeline.errors import ConfigError
from tests.conftest import marker, read_jsonl_gz, run_cli


def _wait_for_marker(path, seconds: int = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, (
            f"no {path} after {seconds} s; see the Slurm logs under its logs/"
        )
        time.sleep(2)


def test_clean_on_slurm_matches_the_local_run(tmp_path, slurm_cluster):
    """...and a second submission is refused while the first one's jobs are queued (the guard:
    corpus/cleaning.py, `_live_jobs` in prepare_phases; without it the phases are submitted twice,
    writing into the same folder)."""
    submit = (
        "stage=clean",
        "lang=fao",
        "work_dir=slurm",
        "cluster.executor=slurm",
        f"cluster.partition={slurm_cluster}",
        "clean.tasks=3",  # job arrays, against the local run's one task
    )
    # Held, so that they are still queued when the second command asks (cluster.* is not hashed: the
    # same run).
    slurm = run_cli(*submit, "+cluster.sbatch_args.hold=true", cwd=tmp_path)
    assert "submitted to Slurm" in slurm.stderr + slurm.stdout
    (listing,) = (tmp_path / "slurm" / "fao").glob(".clean.partial-*/slurm_jobs.json")
    submitted = json.loads(listing.read_text())["job_ids"]
    assert len(submitted) == 6  # five phases and the commit
    again = run_cli(*submit, cwd=tmp_path, check=False)
    assert again.returncode == 1 and "its jobs are still queued or running" in again.stderr, (
        again.stderr[-2000:]
    )
    assert submitted[0] in again.stderr and json.loads(listing.read_text())["job_ids"] == submitted
    subprocess.run(["scontrol", "release", ",".join(submitted)], check=True, timeout=60)
    _wait_for_marker(tmp_path / "slurm" / "fao" / "clean" / "_SUCCESS.json")
    run_cli("stage=clean", "lang=fao", "work_dir=local", cwd=tmp_path)

    on_slurm, local = (
        marker(tmp_path / "slurm", "fao", "clean"),
        marker(tmp_path / "local", "fao", "clean"),
    )
    assert on_slurm["config_hash"] == local["config_hash"]
    assert on_slurm["metrics"] == local["metrics"]
    shards = {
        where: {
            path.name: path.read_bytes()
            for path in sorted((tmp_path / where / "fao" / "clean" / "train").glob("*.jsonl.gz"))
        }
        for where in ("slurm", "local")
    }
    assert shards["slurm"] == shards["local"] and read_jsonl_gz(
        tmp_path / "local" / "fao" / "clean"
    )

    again = run_cli(*submit, cwd=tmp_path)
    assert "Skipping clean for fao" in again.stderr + again.stdout
    # datatrove's folders (its pickled executors among them) follow the umask: none is
    # world-writable.
    assert not [
        path
        for path in (tmp_path / "slurm").rglob("*")
        if path.is_dir() and path.stat().st_mode & 0o002
    ]


def test_a_refused_submission_exits_non_zero(tmp_path, slurm_cluster):
    result = run_cli(
        "stage=clean",
        "lang=fao",
        "cluster.executor=slurm",
        "cluster.partition=no_such_partition",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1 and "sbatch refused a job" in result.stderr


def test_acceptance_a_work_dir_that_the_batch_script_would_run_is_refused_before_submitting(
    tmp_path,
):
    # datatrove writes its folders unquoted into the sbatch script; no Slurm is needed to see the
    # refusal.
    result = run_cli(
        "stage=clean",
        "lang=fao",
        "work_dir='runs/a$(touch pwned)b`touch pwned`c d'",
        "cluster.executor=slurm",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert (
        "Invalid value for `work_dir`" in result.stderr
        and "unquoted into its batch script" in result.stderr
    )
    assert "' ' '$' '(' ')' '`'" in result.stderr  # every offending character named
    assert not (tmp_path / "pwned").exists()
    assert not list(tmp_path.rglob("executor.pik")) and not list(
        tmp_path.rglob("launch_script.slurm")
    )


@pytest.mark.parametrize("value", ["a$(id)b", "a`id`b", "a b", "a'b", "a;b", "a\nb", "50%"])
def test_values_written_unquoted_into_a_batch_script_are_refused(value):
    with pytest.raises(ConfigError, match="Invalid value for `work_dir`"):
        check_script_word("work_dir", f"/scratch/{value}/nob/.clean.partial-0123/logs")
    check_script_word(
        "work_dir", "/scratch/project_465000000/bjørn/work-2.1/nob/.clean.partial-0123/logs"
    )


def test_sbatch_values_are_single_tokens():
    with pytest.raises(ConfigError, match="Invalid value for `cluster.sbatch_args.comment`"):
        validate_cluster(ClusterConfig(sbatch_args={"comment": "a\nrm -rf ~"}))
    with pytest.raises(ConfigError, match="Invalid value for `cluster.partition`"):
        validate_cluster(ClusterConfig(partition="small g"))
    validate_cluster(
        ClusterConfig(
            partition="small-g", sbatch_args={"constraint": "mi250|mi300", "exclusive": True}
        )
    )
