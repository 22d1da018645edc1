"""Each stage killed at each of its commit steps in turn, then run again, leaves what an
uninterrupted run leaves (tests/fault_injection.py): the same documents and counts, marker and
outputs agreeing, nothing left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.commit_steps import KILL_AT_STEP
from tests.conftest import (
    CHAIN_OPTIONS,
    marker,
    packed_copy,
    read_jsonl_gz,
    run_cli,
    write_jsonl_gz,
)
from tests.fault_injection import entries, folder_outputs, kill_at_each_step


def _stage_outputs(cwd: Path, stage: str, skip=lambda path: False) -> dict:
    """A stage's output folder and what else the run left in the language's folder."""
    work = cwd / "work" / "nob"
    return {"files": folder_outputs(work / stage, skip), "language_folder": entries(work)}


def test_clean_killed_at_each_commit_step_leaves_the_documents_and_counts_of_an_uninterrupted_run(
    tmp_path, embedded_records
):
    """The held-out top-up (recorded before any document moves, then finished by the rerun),
    datatrove's phases and the contract's marker and rename. Before the plan was recorded, a rerun
    after a kill in the top-up moved other documents again and lost the first ones, or counted them
    twice."""
    long = [record for record in embedded_records["nob"] if len(record["text"]) > 400][:40]
    assert len(long) == 40

    # One raw folder for every run: documents record their raw file's path, the marker its time.
    write_jsonl_gz(tmp_path / "raw" / "nob" / "a.jsonl.gz", long[:20])
    write_jsonl_gz(
        tmp_path / "raw" / "nob" / "b.jsonl.gz", long[20:] + long[:3]
    )  # three duplicates

    def start() -> Path:
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        (tmp_path / "run").mkdir()
        return tmp_path / "run"

    options = (
        "stage=clean",
        "lang=nob",
        f"raw_dir={tmp_path / 'raw'}",
        "workers=1",
        "clean.tasks=1",
    )
    steps = kill_at_each_step(
        options,
        start,
        lambda cwd: _stage_outputs(cwd, "clean", lambda path: path.parts[0] == "logs"),
    )
    assert (
        "clean: write the held-out top-up" in steps
        and "clean: take the top-up out of train/" in " ".join(steps)
    )
    # The run's counts agree with its documents.
    cwd = tmp_path / "run"
    metrics = marker(cwd / "work", "nob", "clean")["metrics"]
    train, heldout = (
        read_jsonl_gz(cwd / "work" / "nob" / "clean" / split) for split in ("train", "heldout")
    )
    assert metrics["heldout_added_for_minimum"] > 0
    assert (metrics["docs_out"], metrics["docs_heldout"]) == (len(train), len(heldout))
    assert sum(source["docs_out"] for source in metrics["sources"].values()) == len(train)


def test_mix_tokenizer_and_pack_killed_at_each_commit_step_leave_what_an_uninterrupted_run_leaves(
    nob_eng_cleaned, tmp_path
):
    """The contract's commit: the marker, the rename into place and, for mix, the output it replaces
    set aside and removed (a run with another epoch cap before it)."""
    ready = tmp_path / "ready"
    shutil.copytree(nob_eng_cleaned / "work" / "nob", ready / "work" / "nob")
    run_cli("stage=mix", *CHAIN_OPTIONS, "mix.max_epochs=3", cwd=ready)
    for stage in ("mix", "tokenizer", "pack"):

        def start() -> Path:
            shutil.rmtree(tmp_path / "run", ignore_errors=True)
            return shutil.copytree(ready, tmp_path / "run")

        steps = kill_at_each_step(
            (f"stage={stage}", *CHAIN_OPTIONS),
            start,
            lambda cwd, stage=stage: _stage_outputs(cwd, stage),
        )
        assert (
            f"{stage}: write the marker" in steps
            and f"{stage}: move the output into place" in steps
        )
        if stage == "mix":
            assert (
                "mix: set the old output aside" in steps and "mix: remove the old output" in steps
            )
        shutil.rmtree(ready)
        shutil.copytree(tmp_path / "run", ready)


# A few steps of the tiny model: checkpoints at each (the newest kept), so that a kill meets every
# checkpoint step.
TRAINING = {
    "pretrain": (
        "stage=pretrain",
        *CHAIN_OPTIONS,
        "model.num_layers=2",
        "model.max_seq_len=128",
        "init=scratch",
        "train.steps=2",
        "train.warmup_steps=1",
        "train.checkpoint_every=1",
        "train.keep_checkpoints=1",
        "train.eval_tokens=512",
    ),
    "warmup": (
        "stage=warmup",
        *CHAIN_OPTIONS,
        "model.num_layers=2",
        "model.max_seq_len=128",
        "warmup.train.steps=2",
        "warmup.train.warmup_steps=1",
        "warmup.train.global_batch_size=8",
        "warmup.train.eval_tokens=512",
    ),
}


def _trained_outputs(cwd: Path, stage: str) -> dict:
    """The stage's files (weights byte for byte, reports less their timings) and the last loss
    logged for each step (a resumed run logs the steps after its checkpoint again; tensorboard's
    files hold the time)."""
    folder = cwd / "work" / "nob" / stage
    losses = {
        entry["step"]: entry["loss"]
        for entry in map(
            json.loads, (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        )
        if "loss" in entry
    }
    skip = {"metrics.jsonl", "tensorboard"}
    return {**_stage_outputs(cwd, stage, lambda path: path.parts[0] in skip), "losses": losses}


@pytest.mark.parametrize("stage", sorted(TRAINING))
def test_a_training_stage_killed_at_each_commit_step_ends_with_the_weights_of_an_uninterrupted_run(
    stage, nob_packed, english_base, tmp_path
):
    """Checkpoint writes (state file, rename, rotation), the export, the report, the marker and the
    removal of the checkpoints and the starting model: a rerun resumes from the newest checkpoint,
    or uses the ranks' finished result, and ends bit for bit where the uninterrupted run ended."""
    options = (
        (*TRAINING[stage], f"model.base={english_base}") if stage == "warmup" else TRAINING[stage]
    )

    def start() -> Path:
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        return packed_copy(nob_packed, tmp_path / "run")

    steps = kill_at_each_step(options, start, lambda cwd: _trained_outputs(cwd, stage))
    assert f"{stage}: export hf/" in steps and f"{stage}: remove checkpoints, init" in steps
    if stage == "pretrain":
        assert steps[:5] == [
            "checkpoint 1: write state.json",
            "checkpoint 1: move it into place",
            "checkpoint 2: write state.json",
            "checkpoint 2: move it into place",
            "checkpoint 2: remove step-00000001",
        ]


# Written by several ranks: killed (rank 0, at its third commit step: writing checkpoint 4's state
# file) after checkpoint 2, then resumed; the uninterrupted run of the same layout is the reference.
SEVERAL_RANKS = (
    "stage=pretrain",
    *CHAIN_OPTIONS,
    "model.num_layers=2",
    "model.max_seq_len=128",
    "init=scratch",
    "train.steps=6",
    "train.warmup_steps=1",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=2",
    "train.eval_tokens=512",
    "train.log_every=1",
)


def _final_weights(cwd: Path) -> dict:
    return load_file(str(cwd / "work" / "nob" / "pretrain" / "hf" / "model.safetensors"))


@pytest.mark.parametrize("written", ["tp=2", "pp=2", "dp=2"])
def test_checkpoints_written_by_several_ranks_resume_bit_exact(written, nob_packed, tmp_path):
    """Resumed with the layout that wrote them, the losses and final weights are those of the
    uninterrupted run, bit for bit. Written by two data-parallel replicas and resumed by one
    (ZeRO-1's optimizer state cut anew), they are equal up to float32's rounding: the one replica
    sums the batch's gradients in another order."""
    layout = (f"parallel.{written}",)
    reference = packed_copy(nob_packed, tmp_path / "uninterrupted")
    run_cli(*SEVERAL_RANKS, *layout, cwd=reference)
    expected, weights = _trained_outputs(reference, "pretrain")["losses"], _final_weights(reference)
    cwd = packed_copy(nob_packed, tmp_path / "resumed")
    killed = run_cli(*SEVERAL_RANKS, *layout, cwd=cwd, check=False, env={KILL_AT_STEP: "3"})
    assert killed.returncode == 1 and "rank 0 of 2 failed" in killed.stderr, killed.stderr[-3000:]
    resumed = {layout: cwd}
    if written == "dp=2":
        resumed[("parallel.dp=1",)] = shutil.copytree(cwd, tmp_path / "one-replica", symlinks=True)
    for again, folder in resumed.items():
        result = run_cli(*SEVERAL_RANKS, *again, cwd=folder)
        assert "Resuming from" in result.stderr and "step-00000002 (step 2 of 6)" in result.stderr
        found, found_weights = (
            _trained_outputs(folder, "pretrain")["losses"],
            _final_weights(folder),
        )
        assert found_weights.keys() == weights.keys()
        if again == layout:
            assert found == expected
            assert all(torch.equal(found_weights[name], tensor) for name, tensor in weights.items())
        else:
            assert found == pytest.approx(expected, rel=1e-5)
            assert all(
                torch.allclose(found_weights[name], tensor, rtol=1e-4, atol=1e-6)
                for name, tensor in weights.items()
            )
