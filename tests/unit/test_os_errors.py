"""OS errors end a stage with one line that names the path and what to do, exit code 1, never a
traceback: a read-only file system, permission denied, a full disk, a folder removed while the stage
runs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env, run_cli

# Root makes file systems (tmpfs) and sets the immutable flag, the only ways to stop root from
# writing.
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: mounts tmpfs file systems and runs chattr"
)

# Runs the CLI as `python -m pipeline` does, with an audit hook that acts once, the moment the clean
# stage opens its first file in its partial folder (bad_records/file_names.jsonl): a disk that fills
# up or a folder removed while the stage runs, at the same point every time.
WHILE_RUNNING = """
import logging, os, runpy, shutil, sys
done = []
def hook(event, args):
    if event == "open" and not done and str(args[0]).endswith("file_names.jsonl"):
        done.append(True)
        {action}
sys.addaudithook(hook)
runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
"""
# The log lines after it need room the log file has no more (tmpfs gives it a page at a time).
FILL_DISK = """fd = os.open(os.environ["FILL"], os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:
            os.close(fd)
        for _ in range(30):
            logging.getLogger("pipeline").info("the disk is full " * 20)"""
REMOVE_PARTIAL = "shutil.rmtree(os.path.dirname(os.path.dirname(args[0])))"


@contextlib.contextmanager
def tmpfs(folder: Path, *options: str):
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(folder)], check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def raw_corpus(folder: Path) -> Path:
    (folder / "nob").mkdir(parents=True)
    text = "Stortinget vedtok i dag en ny lov om fiske i norske farvann. " * 20
    lines = (json.dumps({"id": str(i), "text": f"{text}{i}"}) for i in range(20))
    (folder / "nob" / "sample.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def run_while_running(
    action: str, cwd: Path, *overrides: str, **env: str
) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, without HYDRA_FULL_ERROR (as users run it), `action` done in
    the stage."""
    environment = {key: value for key, value in cli_env().items() if key != "HYDRA_FULL_ERROR"}
    command = [
        sys.executable,
        "-c",
        WHILE_RUNNING.format(action=action),
        "stage=clean",
        "lang=nob",
        *overrides,
    ]
    return subprocess.run(
        command, cwd=cwd, env={**environment, **env}, capture_output=True, text=True, timeout=300
    )


def one_line(result: subprocess.CompletedProcess, *parts: str) -> None:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if all(part in line for part in parts)]
    assert len(lines) == 1, result.stderr[-3000:]


def test_a_read_only_work_dir_is_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", "ro", "size=1m") as work:
        result = run_cli("stage=mix", "lang=nob", f"work_dir={work}", cwd=tmp_path, check=False)
    one_line(result, "read-only file system:", f"{work}/nob", "work_dir=")


def test_permission_denied_names_the_file_and_the_key(tmp_path):
    with tmpfs(tmp_path / "work", "size=1m") as work:
        lock = work / "nob" / ".mix.lock"
        lock.parent.mkdir()
        lock.touch()
        subprocess.run(["chattr", "+i", str(lock)], check=True)  # EPERM even for root
        try:
            result = run_cli("stage=mix", "lang=nob", f"work_dir={work}", cwd=tmp_path, check=False)
        finally:
            subprocess.run(["chattr", "-i", str(lock)], check=True)
    one_line(
        result,
        "[ERROR]",
        f"permission denied: {lock}: give the pipeline write access to it",
        "work_dir=",
    )


def test_a_full_disk_before_the_stage_is_one_line(tmp_path):
    with tmpfs(tmp_path / "work", "size=64k") as work:
        with contextlib.suppress(OSError), open(work / "filler", "wb") as filler:
            filler.write(bytes(128 * 1024))
        result = run_cli("stage=mix", "lang=nob", f"work_dir={work}", cwd=tmp_path, check=False)
    one_line(
        result,
        "disk full or quota exceeded:",
        f"{work}/nob",
        "the same command continues the stage",
    )


def test_a_disk_that_fills_while_the_stage_runs_is_one_line(tmp_path):
    raw = raw_corpus(tmp_path / "raw")
    with tmpfs(tmp_path / "work", "size=1m") as work:
        result = run_while_running(
            FILL_DISK, tmp_path, f"work_dir={work}", f"raw_dir={raw}", FILL=str(work / "fill")
        )
    one_line(
        result,
        "[ERROR]",
        f"disk full or quota exceeded: {work}: free space, or choose another work_dir=",
    )


def test_a_folder_removed_while_the_stage_runs_is_one_line(tmp_path):
    raw = raw_corpus(tmp_path / "raw")
    result = run_while_running(
        REMOVE_PARTIAL, tmp_path, f"work_dir={tmp_path / 'work'}", f"raw_dir={raw}"
    )
    one_line(
        result,
        "[ERROR]",
        f"no such file or folder: {tmp_path / 'work' / 'nob'}/.clean.partial-",
        "run the same command again",
    )


def test_a_file_in_the_work_dir_path_is_one_line(tmp_path):
    (tmp_path / "file").touch()
    result = run_cli(
        "stage=mix", "lang=nob", f"work_dir={tmp_path / 'file' / 'work'}", cwd=tmp_path, check=False
    )
    one_line(result, "not a folder:", str(tmp_path / "file"), "work_dir=")


def test_printing_the_config_writes_nothing_so_needs_no_writable_work_dir(tmp_path):
    with tmpfs(tmp_path / "ro", "ro", "size=1m") as work:
        result = run_cli("--cfg", "job", "stage=mix", "lang=nob", f"work_dir={work}", cwd=tmp_path)
    assert f"work_dir: {work}" in result.stdout
