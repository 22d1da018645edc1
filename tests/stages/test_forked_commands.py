"""The tests' fork server (tests/cli_server.py) runs a command as a fresh process does: the suite's
stage tests run forked, and these check that forked and real processes (PIPELINE_TESTS_FORK=0) agree
in what tests observe."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import cli_env, forkable, marker, packed_copy, ranks_from_server, run_cli
from tests.stages.test_interrupted_commits import TRAINING, _trained_outputs


def test_a_forked_command_trains_what_a_process_of_its_own_trains_and_reports_its_own_memory(
    nob_packed, tmp_path, monkeypatch
):
    """The same files, weights and losses bit for bit; a peak memory of the command's own (the
    server's imports count as a fresh process's would: the bound is a factor, both ways)."""
    assert forkable(cli_env())  # the first run below is forked
    forked = packed_copy(nob_packed, tmp_path / "forked")
    run_cli(*TRAINING["pretrain"], cwd=forked)
    monkeypatch.setenv("PIPELINE_TESTS_FORK", "0")
    real = packed_copy(nob_packed, tmp_path / "real")
    run_cli(*TRAINING["pretrain"], cwd=real)
    assert _trained_outputs(forked, "pretrain") == _trained_outputs(real, "pretrain")
    peaks = {
        name: marker(cwd / "work", "nob", "pretrain")["metrics"]["peak_memory_stage_process"][
            "host_rss_gib"
        ]
        for name, cwd in (("forked", forked), ("real", real))
    }
    assert 0.5 < peaks["forked"] / peaks["real"] < 2, peaks


def test_each_forked_process_draws_its_own_random_numbers_as_a_fresh_interpreter_does():
    """Python's, NumPy's and torch's generators are seeded anew in each child, from the system's
    randomness."""
    draw = (
        "import os, random, numpy, torch; "
        "print(os.getppid(), random.random(), numpy.random.random(), torch.rand(1).item())"
    )
    with ranks_from_server():  # `python -c` forked from the server
        draws = [
            subprocess.run(
                [sys.executable, "-c", draw],
                capture_output=True,
                text=True,
                check=True,
                env=cli_env(),
            ).stdout.split()
            for _ in range(2)
        ]
    real = subprocess.run(
        [sys.executable, "-c", draw], capture_output=True, text=True, check=True
    ).stdout.split()
    assert all(len(values) == 4 for values in (*draws, real))
    assert all(
        int(values[0]) != os.getpid() for values in draws
    )  # forked by the server, not started from here
    for generator in range(1, 4):
        assert len({draws[0][generator], draws[1][generator], real[generator]}) == 3, generator
