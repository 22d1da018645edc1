"""The README's main command in miniature: `stage=all` without model.base builds the demo's English
base model from scratch, runs every stage for the language, and reports base > warmup > pretrain in
bits per byte."""

from __future__ import annotations

import json

from pipeline.config import STAGE_NAMES
from tests.conftest import copy_of, marker, run_cli

# The demo's budgets cut down to seconds; the order of the results must already show.
SMALL = (
    "lang=nob",
    "workers=2",
    "tokenizer.vocab_size=1024",
    "model.max_seq_len=128",
    "demo_base.train.steps=40",
    "demo_base.train.eval_every=0",
    "demo_base.train.checkpoint_every=0",
    "warmup.train.steps=12",
    "warmup.train.eval_every=6",
    "train.steps=24",
    "train.eval_every=12",
    "train.warmup_steps=4",
    "train.checkpoint_every=0",
    "eval.max_bytes=60000",
    # the training logs' held-out scores; the evaluate stage's (eval.max_bytes) are what is compared
    "demo_base.train.eval_tokens=2048",
    "warmup.train.eval_tokens=4096",
    "train.eval_tokens=4096",
)


def test_stage_all_builds_the_demo_base_then_the_whole_recipe(tmp_path_factory, nob_eng_cleaned):
    # English and Norwegian cleaned as stage=all would (the session's copy): the command goes on
    # from there.
    tmp_path = copy_of(nob_eng_cleaned, tmp_path_factory, "demo")
    result = run_cli("stage=all", *SMALL, cwd=tmp_path)
    assert "Skipping clean for eng" in result.stderr and "Skipping clean for nob" in result.stderr
    work = tmp_path / "work"
    base = work / "eng" / "pretrain" / "hf"
    assert (
        marker(work, "eng", "pretrain")["config"]["init"] == "scratch"
        and (base / "config.json").is_file()
    )
    for stage in STAGE_NAMES:
        assert marker(work, "nob", stage)
    warmup = marker(work, "nob", "warmup")
    # The base is recorded relative to the work folder and known by the hash of the stage that made
    # it.
    assert warmup["metrics"]["base"] == "${work_dir}/eng/pretrain/hf"
    assert warmup["inputs"]["base_model"] == {
        "stage_output": "eng/pretrain",
        "within": "hf",
        "config_hash": marker(work, "eng", "pretrain")["config_hash"],
    }
    # The tokenizer report compares the new tokenizer with the demo base's.
    tokenizer = json.loads((work / "nob" / "tokenizer" / "report.json").read_text(encoding="utf-8"))
    assert tokenizer["base"]["path"] == "${work_dir}/eng/pretrain/hf/tokenizer.json"
    assert tokenizer["new"]["scores"]["fertility"] < tokenizer["base"]["scores"]["fertility"]
    report_dir = work / "nob" / "evaluate"
    assert f"Report: {report_dir / 'report.md'}" in result.stdout
    scores = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))["scores"]
    assert list(scores) == ["base", "warmup", "pretrain"]
    bpb = {name: score["heldout"]["bits_per_byte"] for name, score in scores.items()}
    assert bpb["pretrain"] < bpb["warmup"] < bpb["base"], bpb
    for plot in ("bpb.png", "training_curves.png"):
        assert (report_dir / plot).stat().st_size > 1000
    # The tasks built from the held-out split are scored for every model; the report shows their
    # table.
    tasks = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))["tasks"]
    assert list(tasks["continuation"]["results"]) == ["base", "warmup", "pretrain"]
    assert "## Downstream tasks" in (report_dir / "report.md").read_text(encoding="utf-8")

    again = run_cli("stage=all", *SMALL, cwd=tmp_path)
    assert (
        "Skipping pretrain for eng" in again.stderr and "Skipping evaluate for nob" in again.stderr
    )
    assert "Running" not in again.stderr

    # stage=status after the demo, with the work folder given relative or absolute: every stage is
    # done.
    for work_dir in ("work", str(work)):
        status = run_cli("stage=status", *SMALL, f"work_dir={work_dir}", cwd=tmp_path).stdout
        (row,) = [line.split() for line in status.splitlines() if line.startswith("nob ")]
        assert row[-len(STAGE_NAMES) :] == ["done"] * len(STAGE_NAMES), status
