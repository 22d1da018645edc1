"""The clean stage as Slurm jobs (datatrove's Slurm executor) on a real one-node Slurm cluster."""

from __future__ import annotations

import time

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
