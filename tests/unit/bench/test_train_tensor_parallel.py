"""bench/train.py's tensor-parallel anchor (issue 57) on a CPU: `--smoke` at tp 2 with sequence
parallelism and two data-parallel replicas (the anchor's layers cut over the mesh's tp dimension,
the norms on sequence parts, the replicas' gradients averaged; its plan without sequence parallelism,
which only keeps the residual stream whole, runs in the GPU benchmarks), over gloo with every
collective checked (TORCH_DISTRIBUTED_DEBUG=DETAIL). The anchor's rows are in the table, and from the
same weights it trains the same losses as ours on one rank."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.conftest import REPO, repo_pythonpath

# Their ranks (tp x dp).
LAYOUTS = {"2x1x2+sp": 4}
NAME = "anchor: plain PyTorch, tensor-parallel (DTensor)"
# fp32 on a CPU: sums in another order move the losses by ~1e-7. Query heads that read another
# rank's key/value heads move them by ~1e-1, the vocabulary's padding left in the softmax by ~2e-4,
# data-parallel replicas that do not average their gradients by ~8e-6 (the second step's loss, after
# one step at learning rate 1e-4).
TOLERANCE = 1e-6


def test_the_tensor_parallel_anchor_is_timed_and_trains_what_ours_trains(tmp_path):
    out = tmp_path / "train.md"
    command = [
        sys.executable,
        str(REPO / "bench" / "train.py"),
        "--smoke",
        "--models=rope",
        "--rows=dense",
        f"--layouts=1x1x1,{','.join(LAYOUTS)}",
        "--no-hf",
        f"--out={out}",
    ]
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = out.read_text(encoding="utf-8")
    assert "FAILED" not in report, report
    results = json.loads(report.split("```json\n", 1)[1].split("\n```", 1)[0])
    anchors = {r["layout"]: r for r in results if r["role"] == "tp-anchor"}
    assert sorted(anchors) == sorted(LAYOUTS)
    table, agreement = report.split("Loss agreement", 1)
    assert "| max relative difference from ours 1x1x1 |" in agreement
    for layout, anchor in anchors.items():
        assert anchor["name"].startswith(NAME), anchor
        assert anchor["gpus"] == LAYOUTS[layout], anchor
        assert math.isfinite(anchor["tokens_per_s"]) and anchor["tokens_per_s"] > 0, anchor
        assert f"| {anchor['name']} | RoPE model | dense | {layout} | {LAYOUTS[layout]} |" in table
        assert f"| ratio ours / tensor-parallel anchor, {layout}, RoPE model," in table
        # Its losses and their largest relative difference from ours at 1x1x1, as the table has them.
        row = next(
            line
            for line in agreement.splitlines()
            if line.startswith(f"| {anchor['name']} | {layout} |")
        )
        assert float(row.rstrip(" |").rsplit("|", 1)[1]) < TOLERANCE, row
