"""Shared helpers: run the real CLI, read the shards a stage wrote, build raw corpora."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"


def run_cli(*overrides: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m pipeline <overrides>` in `cwd`, as a user would type it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *overrides], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=900,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"pipeline {' '.join(overrides)} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def read_jsonl_gz(folder: Path) -> list[dict]:
    """Every record of every `*.jsonl.gz` below `folder`."""
    records = []
    for path in sorted(Path(folder).rglob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def write_jsonl_gz(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def marker(work: Path, lang: str, stage: str) -> dict:
    return json.loads((work / lang / stage / "_SUCCESS.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def embedded_records() -> dict[str, list[dict]]:
    """The embedded sample of each language, as records."""
    return {folder.name: read_jsonl_gz(folder) for folder in sorted(DATA.iterdir()) if folder.is_dir()}


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm on localhost, started (and installed if needed) by the repo's script."""
    import shutil

    if os.geteuid() != 0 and shutil.which("sbatch") is None:
        pytest.skip("starting a local Slurm needs root (CI runs as root); run tests/slurm/start_local_slurm.sh")
    subprocess.run(["bash", str(REPO / "tests" / "slurm" / "start_local_slurm.sh")], check=True, timeout=600)
    return "debug"
