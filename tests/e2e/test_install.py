"""Installs the way clusters do: a wheel of the repository (what `pip install .` builds) installed into
a fresh folder runs the CLI with no checkout, its configs and language table inside the package.

The wheel is built from a copy of the package's sources (no `build/` left in the checkout, and none
of its stale files in the wheel) with the interpreter's own setuptools, offline. The commands run
outside the repository with the fresh folder first on PYTHONPATH, so that `pipeline` is the
installed one; the dependencies come from the same interpreter's site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--no-cache-dir"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh folder with the repository's wheel installed in it, and nothing else."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(
        REPO / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = tmp / "wheels"
    build = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels)]
    built = subprocess.run([*build, str(source)], capture_output=True, text=True, cwd=tmp)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("lowres_cpt-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"pipeline/conf/config.yaml", "pipeline/conf/languages.yaml"} <= names
    assert not any(name.startswith("data/") for name in names)  # the samples stay in the checkout
    target = tmp / "target"
    install = [*PIP, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def run_installed(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m pipeline *args` in `cwd`, importing the package from `target` only: the checkout
    is left out of PYTHONPATH (where the environment put it, as tests/conftest.py's commands do)."""
    others = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != REPO
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *others])}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_an_installed_wheel_runs_the_cli_without_the_checkout(installed, tmp_path):
    where = run_installed(installed, tmp_path, "-c", "import pipeline; print(pipeline.__file__)")
    assert Path(where.stdout.strip()).resolve().is_relative_to(installed.resolve()), where

    shown = run_installed(installed, tmp_path, "-m", "pipeline", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "Usage: python -m pipeline stage=<stage>" in shown.stdout

    # The language table, and the config groups' files (a model preset, a cluster).
    job = run_installed(
        installed,
        tmp_path,
        "-m",
        "pipeline",
        "--cfg",
        "job",
        "stage=pretrain",
        "lang=nob",
        "model=bloom-560m",
        "cluster=lumi",
    )
    assert job.returncode == 0, job.stderr
    assert "code: nob" in job.stdout
    assert "hidden_size: 1024  # preset model=bloom-560m" in job.stdout
    assert "partition: small  # cluster=lumi" in job.stdout

    # Hydra's own composition (hydra.main's config_path), which `--cfg job --package` goes through.
    package = run_installed(
        installed,
        tmp_path,
        "-m",
        "pipeline",
        "--cfg",
        "job",
        "-p",
        "lang",
        "stage=clean",
        "lang=nob",
    )
    assert package.returncode == 0, package.stderr
    assert "code: nob" in package.stdout

    # No embedded samples in a wheel: the default raw_dir names none, and the stage says what to do.
    clean = run_installed(installed, tmp_path, "-m", "pipeline", "stage=clean", "lang=nob")
    assert clean.returncode == 1, clean.stdout + clean.stderr
    said = clean.stdout + clean.stderr
    assert "raw_dir is not given" in said and "Give raw_dir=" in said, said
    assert "Traceback" not in said, said
