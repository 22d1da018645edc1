"""bench/tp_overlap.py (issue 57, build 2) on a CPU: two gloo ranks with every collective checked
(TORCH_DISTRIBUTED_DEBUG=DETAIL) run the shipped tensor-parallel block and the variants whose
row-parallel all-reduces run in chunks beside the products, and each variant computes what the
shipped layers compute (output and input gradient)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.conftest import REPO, repo_pythonpath


def test_every_overlap_variant_is_timed_and_computes_what_the_shipped_block_does(tmp_path):
    out = tmp_path / "tp_overlap.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(REPO / "bench" / "tp_overlap.py"),
        "--smoke",
        "--chunks=2,3",
        f"--out={out}",
    ]
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    variants = [r["variant"] for r in report["results"]]
    assert variants == ["shipped", "chunks=2", "chunks=3", "chunks=3 +priority"]
    for result in report["results"]:
        assert result["tp"] == 2
        assert math.isfinite(result["ms"]) and result["ms"] > 0, result
        assert math.isfinite(result["efficiency"]) and result["efficiency"] > 0, result
        # fp32: products cut into runs of tokens sum the same terms in the same order
        assert result["difference"] < 1e-6, result
