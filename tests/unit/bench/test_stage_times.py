"""bench/stage_times.py: the pipeline's log lines cut a `stage=all` run into stages (a stage skipped
as up to date is none), and the machine's samples give each stage's busy cores and GPUs."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import REPO

# The contract's own log lines (pipeline/contract.py), which the script reads.
RUNNING = "Running %s for %s (config hash %s) in %s"
FINISHED = "%s for %s finished: %s"
SKIPPED = "Skipping %s for %s: it is up to date (config hash %s, finished %s)."


def _stage_times():
    spec = importlib.util.spec_from_file_location("stage_times", REPO / "bench" / "stage_times.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_stages_are_cut_from_the_contracts_log_lines_and_the_samples_averaged_within_them():
    contract = (REPO / "pipeline" / "contract.py").read_text(encoding="utf-8")
    assert f'"{RUNNING}"' in contract and f'"{FINISHED}"' in contract
    module = _stage_times()
    events = [
        (0.0, f"[t][pipeline.contract][INFO] - {SKIPPED % ('clean', 'eng', 'a1', 'x')}\n"),
        (1.0, f"[t][pipeline.contract][INFO] - {RUNNING % ('replay', 'eng', 'b2', '/w')}\n"),
        (61.0, f"[t][pipeline.contract][INFO] - {FINISHED % ('replay', 'eng', '/w/m')}\n"),
        (61.0, f"[t][pipeline.contract][INFO] - {RUNNING % ('tokenizer', 'nob', 'c3', '/w')}\n"),
        (181.0, "some other line\n"),
    ]
    found = module.spans(events)
    assert [(s.stage, s.lang, s.start, s.end) for s in found] == [
        ("replay", "eng", 1.0, 61.0),
        ("tokenizer", "nob", 61.0, None),
    ]
    # The replay kept 2 of 4 GPUs busy and one core; the tokenizer 16 cores and no GPU.
    samples = [
        {"t": float(t), "cores_busy": 1.0, "gpus_busy": 2.0, "gpus": 4} for t in range(1, 61)
    ] + [{"t": float(t), "cores_busy": 16.0, "gpus_busy": 0.0, "gpus": 4} for t in range(61, 181)]
    text = module.table(found, samples, 0.0, 181.0)
    assert "| replay eng | 1.0 min | 1.0 | 2.0 |" in text
    assert "| tokenizer nob (did not finish) | 2.0 min | 16.0 | 0.0 |" in text
    assert "Whole run: 3.0 min; a GPU at work 33% of it; the 4 GPUs 17% used." in text
    # Off a GPU machine the GPU columns say so instead of showing a number.
    cpu_only = [{**sample, "gpus_busy": None, "gpus": None} for sample in samples]
    text = module.table(found, cpu_only, 0.0, 181.0)
    assert "| replay eng | 1.0 min | 1.0 | - |" in text and text.rstrip().endswith("3.0 min.")
