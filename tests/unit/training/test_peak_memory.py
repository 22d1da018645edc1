"""A process's reported peak memory is its own: not that of the process that started it (getrusage's
ru_maxrss survives exec on Linux, so a rank started by a stage holding a model would report the
stage's peak)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

GIB = 2**30


def test_a_process_started_by_a_large_one_reports_its_own_peak():
    held = bytearray(GIB)  # touched: resident in this process
    code = "import json; from pipeline.training.peak_memory import peak_memory; print(json.dumps(peak_memory()))"
    started = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    reported = json.loads(started.stdout.strip().splitlines()[-1])
    assert len(held) == GIB
    # the child holds torch and nothing else: a few hundred MiB, not the parent's gigabyte
    assert 0.05 < reported["host_rss_gib"] < 0.75, reported
    assert reported["device_gib"] is None
