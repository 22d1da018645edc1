"""Stage `pretrain` through the real CLI on the packed Norwegian sample: exact resume after SIGKILL,
a clean stop on SIGTERM, resuming in another parallel layout or with a larger step budget from the
newest checkpoint that verifies, refusing other changes while checkpoints exist, non-finite steps
and weights."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.config import CONF_DIR, register_configs
from pipeline.errors import StageError
from pipeline.model.files import save_checkpoint
from pipeline.model.model_tensors import CHECKPOINT_WEIGHTS
from pipeline.model.transformer import Transformer
from pipeline.tensor_files import new_file_mode
from pipeline.tokenization.folder import load_tokenizer
from pipeline.training.train_config import lr_factor
from tests.conftest import CHAIN_OPTIONS, cli_env, marker, run_cli

# A small held-out sample: scoring it before and after is a good part of a tiny run on a CPU.
TINY = (
    "model.num_layers=2",
    "model.max_seq_len=128",
    "train.log_every=1",
    "train.warmup_steps=2",
    "train.eval_tokens=2048",
)
SCRATCH = (
    "stage=pretrain",
    *CHAIN_OPTIONS,
    *TINY,
    "init=scratch",
    "train.steps=12",
    "train.checkpoint_every=4",
)


def metrics(cwd) -> list[dict]:
    folder = cwd / "work" / "nob" / "pretrain"
    if not folder.is_dir():
        folder = next((cwd / "work" / "nob").glob(".pretrain.partial-*"))
    return [
        json.loads(line)
        for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]


def losses_by_step(cwd) -> dict[int, float]:
    """The last loss logged for each step (a resumed run logs the steps after its checkpoint again)."""
    return {entry["step"]: entry["loss"] for entry in metrics(cwd) if "loss" in entry}


def start(cwd, *overrides) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *overrides],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_step(cwd, step: int, process: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if max(losses_by_step(cwd), default=0) >= step:
                return
        except (StopIteration, FileNotFoundError):
            pass
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step}")


@pytest.fixture()
def fresh(nob_packed):
    """The packed work folder with no pretrain output from an earlier test."""
    for old in (nob_packed / "work" / "nob").glob("*pretrain*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    return nob_packed


@pytest.fixture(scope="module")
def uninterrupted(nob_packed):
    for old in (nob_packed / "work" / "nob").glob("*pretrain*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    run_cli(*SCRATCH, cwd=nob_packed)
    result = losses_by_step(nob_packed)
    assert sorted(result) == list(range(1, 13)) and result[12] < result[1]
    logged = [entry for entry in metrics(nob_packed) if "loss" in entry]
    for key in ("lr", "grad_norm", "tokens_per_s", "tflops_per_device", "host_rss_gib"):
        assert all(entry[key] > 0 for entry in logged), key
    assert all(
        entry["mfu"] is None and entry["device_gib"] is None for entry in logged
    )  # a CPU: no peak, no device
    output = nob_packed / "work" / "nob" / "pretrain"
    board = EventAccumulator(str(output / "tensorboard"))
    board.Reload()
    assert [event.step for event in board.Scalars("heldout_bpb")] == [
        0,
        12,
    ]  # the last score reached the file too
    # safetensors would write 0600 whatever the umask: the outputs follow it (0644 under umask 022).
    for weights in (
        output / "hf" / "model.safetensors",
        output / "checkpoint" / CHECKPOINT_WEIGHTS,
    ):
        assert stat.S_IMODE(weights.stat().st_mode) == new_file_mode(), weights
    return result


def test_activation_checkpointing_changes_memory_not_losses(uninterrupted, fresh):
    run_cli(*SCRATCH, "train.activation_checkpoint_interval=1", cwd=fresh)
    assert losses_by_step(fresh) == pytest.approx(uninterrupted, rel=1e-6)


def test_acceptance_sigkill_then_resume_gives_the_uninterrupted_losses(uninterrupted, fresh):
    process = start(fresh, *SCRATCH)
    wait_for_step(fresh, 6, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    checkpoints = partial / "checkpoints"
    # The kill lands after step 6: the checkpoint of step 4 is there, that of step 8 too if the run
    # got that far.
    saved = sorted(path.name for path in checkpoints.iterdir() if (path / "state.json").is_file())
    assert saved[0] == "step-00000004" and saved[-1] in ("step-00000004", "step-00000008"), saved
    newest = int(saved[-1].split("-")[1])
    assert not (fresh / "work" / "nob" / "pretrain" / "_SUCCESS.json").exists()
    # What a kill during a checkpoint leaves behind is never resumed from.
    (checkpoints / f".step-{newest + 4:08d}.tmp").mkdir(exist_ok=True)
    (checkpoints / "step-00000012").mkdir(exist_ok=True)
    # Written before checkpoints recorded their layout: it resumes only in its own.
    for name in saved:
        folder = checkpoints / name
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        assert "layout-pp0-tp0.json" in state["files"]
        for file in [file for file in state["files"] if file.startswith("layout-")]:
            (folder / file).unlink()
            del state["files"][file]
        (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")
    refused = run_cli(*SCRATCH, "parallel.pp=2", cwd=fresh, check=False)
    assert refused.returncode == 1
    assert "parallel.pp=1" in refused.stderr and "did not record its layout" in refused.stderr
    result = run_cli(*SCRATCH, cwd=fresh)
    assert "Resuming from" in result.stderr and saved[-1] in result.stderr
    resumed = losses_by_step(fresh)
    for step in range(newest + 1, 13):
        assert resumed[step] == uninterrupted[step], f"step {step}"
    assert not (fresh / "work" / "nob" / "pretrain" / "checkpoints").exists()
    assert (fresh / "work" / "nob" / "pretrain" / "hf" / "model.safetensors").is_file()


def test_acceptance_sigterm_checkpoints_and_a_resume_with_tensor_parallelism_continues(
    uninterrupted, fresh
):
    process = start(fresh, *SCRATCH, "train.checkpoint_every=0")
    wait_for_step(fresh, 3, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 75, process.stderr.read()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    (saved,) = [
        path for path in (partial / "checkpoints").iterdir() if (path / "state.json").is_file()
    ]
    stopped = int(saved.name.split("-")[1])
    # Another layout (the checkpoint's one rank cut in two tensor-parallel shards, the vocabulary
    # padded anew), and checkpoints every 4 steps again: neither changes the run's identity.
    result = run_cli(*SCRATCH, "parallel.tp=2", cwd=fresh)
    assert "Resuming from" in result.stderr
    resumed = losses_by_step(fresh)
    for step in range(stopped + 1, 13):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5), f"step {step}"
    metrics = marker(fresh / "work", "nob", "pretrain")["metrics"]
    assert metrics["steps"] == 12
    # The ranks leave without the interpreter's teardown: what rank 0 logged reached the files
    # first.
    board = EventAccumulator(str(fresh / "work" / "nob" / "pretrain" / "tensorboard"))
    board.Reload()
    assert max(event.step for event in board.Scalars("heldout_bpb")) == 12
    # Each rank's peak memory, with its place in the layout (on a CPU: host memory only).
    peaks = metrics["peak_memory_per_rank"]
    assert [(p["rank"], p["pp"], p["tp"], p["dp"]) for p in peaks] == [(0, 0, 0, 0), (1, 0, 1, 0)]
    assert all(0.1 < p["host_rss_gib"] < 16 and p["device_gib"] is None for p in peaks)
    assert metrics["peak_memory_stage_process"]["host_rss_gib"] > 0.1


def test_acceptance_a_larger_budget_resumes_from_the_newest_sound_checkpoint_and_other_changes_are_refused(
    fresh,
):
    process = start(fresh, *SCRATCH, "train.checkpoint_every=2")
    wait_for_step(fresh, 7, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    checkpoints = partial / "checkpoints"
    kept = sorted(path.name for path in checkpoints.iterdir())
    # The kill lands at step 7 or a little later on a fast machine: the two newest checkpoints, 2
    # steps apart.
    before, newest = (int(name.split("-")[1]) for name in kept[-2:])
    assert newest - before == 2 and 6 <= newest <= 10, kept

    # Another learning rate is another run: refused while the checkpoints exist, and nothing is
    # deleted.
    refused = run_cli(*SCRATCH, "train.lr=5e-4", cwd=fresh, check=False)
    assert refused.returncode == 1
    assert (
        "train.lr" in refused.stderr
        and "resume=never" in refused.stderr
        and f"step-{before}, step-{newest}" in refused.stderr
    )
    assert sorted(path.name for path in checkpoints.iterdir()) == kept and partial.is_dir()

    # The newest checkpoint's model file cut short (a full quota): the run goes back to the one
    # before.
    weights = checkpoints / f"step-{newest:08d}" / "model-pp0-tp0.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    logged_before = len(metrics(fresh))
    result = run_cli(*SCRATCH, "train.steps=14", cwd=fresh)
    assert (
        "Continuing the interrupted run" in result.stderr
        and "train.steps 12 -> 14" in result.stderr
    )
    assert (
        "Skipping checkpoint" in result.stderr and "model-pp0-tp0.safetensors has" in result.stderr
    )
    assert (
        "Resuming from" in result.stderr
        and f"step-{before:08d} (step {before} of 14)" in result.stderr
    )
    resumed = [entry for entry in metrics(fresh)[logged_before:] if "loss" in entry]
    assert [entry["step"] for entry in resumed] == list(
        range(before + 1, 15)
    )  # no step before the checkpoint again
    # The schedule is the one for the new total, from the checkpoint's step on.
    train = marker(fresh / "work", "nob", "pretrain")["config"]["train"]
    for entry in resumed:
        expected = train["lr"] * lr_factor(
            entry["step"] - 1, train["schedule"], 14, train["warmup_steps"], train["min_lr_ratio"]
        )
        assert entry["lr"] == pytest.approx(expected, rel=1e-6), entry["step"]
    assert marker(fresh / "work", "nob", "pretrain")["metrics"]["steps"] == 14


def _model_with_a_nan(folder, packed_dir) -> None:
    """A pipeline checkpoint of the configured tiny model with the pack's tokenizer, one weight NaN."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        model_cfg = OmegaConf.to_object(
            compose("config", overrides=["stage=pretrain", "lang=nob", *TINY])
        ).model
    tokenizer_dir = packed_dir / "work" / "nob" / "tokenizer"
    vocab = load_tokenizer(tokenizer_dir).get_vocab_size(with_added_tokens=True)
    save_checkpoint(Transformer(dataclasses.replace(model_cfg, vocab_size=vocab)), folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tokenizer_dir / name, folder / name)
    tensors = load_file(str(folder / CHECKPOINT_WEIGHTS))
    tensors[sorted(tensors)[-1]].view(-1)[7] = float("nan")
    save_file(tensors, str(folder / CHECKPOINT_WEIGHTS))


def test_acceptance_a_nan_in_the_starting_weights_stops_pretrain_and_evaluate(fresh, tmp_path):
    poisoned = tmp_path / "poisoned"
    _model_with_a_nan(poisoned, fresh)
    result = run_cli(*SCRATCH, "init=hf", f"model.base={poisoned}", cwd=fresh, check=False)
    assert result.returncode == 1 and "holds non-finite values" in result.stderr, result.stderr[
        -2000:
    ]
    output = fresh / "work" / "nob" / "pretrain"
    assert not (output / "_SUCCESS.json").exists() and not (output / "hf").exists()

    scored = run_cli(
        "stage=evaluate", *CHAIN_OPTIONS, f"model.base={poisoned}", cwd=fresh, check=False
    )
    assert scored.returncode == 1 and "non-finite values" in scored.stderr
    assert not (fresh / "work" / "nob" / "evaluate" / "_SUCCESS.json").exists()


def test_non_finite_steps_are_skipped_and_too_many_stop_the_run(fresh):
    # A learning rate of 1e31 (1e30 in the first warm-up step) sends the weights beyond float32
    # after the first step: every later loss is NaN. (Short sequences: NaN arithmetic is slow.)
    result = run_cli(
        *SCRATCH,
        "train.lr=1e31",
        "train.warmup_steps=10",
        "train.max_bad_steps=3",
        "train.seq_len=32",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
        "train.eval_tokens=1",
        cwd=fresh,
        check=False,
    )
    assert result.returncode == 1
    assert "3 steps in a row had a non-finite loss or gradient" in result.stderr
    assert not (fresh / "work" / "nob" / "pretrain" / "_SUCCESS.json").exists()
    # Skipped steps move the schedule on with the step counter (DeepSpeed alone would hold it back):
    # step s of the linear warm-up runs at s/10 of the peak whatever was skipped before it.
    logged = [entry for entry in metrics(fresh) if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    assert [entry["lr"] for entry in logged] == pytest.approx([1e30, 2e30, 3e30], rel=1e-6)


def test_outside_slurm_the_slurm_executor_says_how_to_submit(fresh):
    result = run_cli(*SCRATCH, "cluster.executor=slurm", cwd=fresh, check=False)
    assert (
        result.returncode == 1
        and "not in one" in result.stderr
        and "sbatch --ntasks=1" in result.stderr
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("kernels=cuda", "Invalid value for `kernels`: 'cuda'. Allowed: auto, reference, triton"),
        (
            "train.global_batch_size=30",
            "a multiple of train.micro_batch_size x parallel.dp = 4 x 1 = 4",
        ),
        ("init=pretrained", "Invalid value for `init`: 'pretrained'. Allowed: warmup, hf, scratch"),
    ],
)
def test_bad_training_options_fail_before_any_work(tmp_path, override, message):
    result = run_cli(
        "stage=pretrain",
        "lang=nob",
        "train.micro_batch_size=4",
        override,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1 and message in result.stderr
    assert not list((tmp_path / "work" / "nob").glob("*pretrain*"))


def _flip_a_byte(path) -> None:
    """The same size, one byte of the tensor data changed: what a bad disk or a copy gone wrong
    leaves, which the size check cannot see (safetensors still reads it, with other weights)."""
    data = bytearray(path.read_bytes())
    data[-len(data) // 4] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checkpoints_that_fail_their_checksums_are_skipped_or_refused_and_a_budget_below_them_is_refused(
    fresh,
):
    """Guards (pipeline/training/checkpoint.py `choose`): the checksum check (a same-size byte
    flip), and the refusal when no checkpoint verifies; (pipeline/training/run.py
    `steps_behind_checkpoints`) pretrain's own refusal of a budget that ends before its newest
    checkpoint. Each fails with its guard removed."""
    process = start(fresh, *SCRATCH, "train.checkpoint_every=2")
    wait_for_step(fresh, 7, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    checkpoints = next((fresh / "work" / "nob").glob(".pretrain.partial-*")) / "checkpoints"
    kept = sorted(checkpoints.iterdir())
    before, newest = (int(path.name.split("-")[1]) for path in kept[-2:])

    # A budget that ends before the newest checkpoint: refused by pretrain, nothing deleted.
    refused = run_cli(*SCRATCH, f"train.steps={newest - 1}", cwd=fresh, check=False)
    assert refused.returncode == 1
    assert (
        f"its newest checkpoint is at step {newest}, past train.steps={newest - 1}"
        in refused.stderr
    )
    assert sorted(checkpoints.iterdir()) == kept

    # Every checkpoint fails its checksum: refused, nothing deleted; the same files again,
    # untouched.
    originals = {
        path: path.read_bytes() for path in checkpoints.glob("*/model-pp0-tp0.safetensors")
    }
    for path in originals:
        _flip_a_byte(path)
    refused = run_cli(*SCRATCH, cwd=fresh, check=False)
    assert (
        refused.returncode == 1
        and "None of the checkpoints" in refused.stderr
        and "resume=never" in refused.stderr
    )
    assert refused.stderr.count("does not match the checksum written with it") == len(kept)
    assert sorted(checkpoints.iterdir()) == kept

    # Only the newest fails its checksum: the run goes back to the one before and finishes.
    for path, data in originals.items():
        path.write_bytes(data)
    _flip_a_byte(checkpoints / f"step-{newest:08d}" / "model-pp0-tp0.safetensors")
    logged_before = len(metrics(fresh))
    result = run_cli(*SCRATCH, cwd=fresh)
    assert (
        "Skipping checkpoint" in result.stderr
        and "does not match the checksum written with it" in result.stderr
    )
    assert f"step-{before:08d} (step {before} of 12)" in result.stderr
    resumed = [entry["step"] for entry in metrics(fresh)[logged_before:] if "loss" in entry]
    assert resumed == list(range(before + 1, 13))


def test_training_that_ends_non_finite_keeps_its_checkpoints_and_exports_nothing(fresh):
    """Guard (pipeline/training/run.py `refuse_non_finite_end`, after the ranks): a run that ends
    with a non-finite loss, its bad-steps limits lifted so that it reaches its end, is neither
    exported nor marked done, and its checkpoints stay. Its newest checkpoint holds a NaN in the
    optimizer's fp32 weights, written with its checksums (as a bad step saved would be): it
    verifies, the first step copies the NaN into the model, and every later loss is NaN."""
    from pipeline.training.checkpoint_files import FILES_KEY, STATE_FILE, file_entry

    process = start(fresh, *SCRATCH, "train.checkpoint_every=2")
    wait_for_step(fresh, 5, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    newest = sorted((partial / "checkpoints").iterdir())[-1]
    optimizer = newest / "optim-pp0-tp0-dp0.safetensors"
    tensors = load_file(str(optimizer))
    tensors["fp32.0"].view(-1)[0] = float("nan")
    save_file(tensors, str(optimizer))
    state = json.loads((newest / STATE_FILE).read_text())
    state[FILES_KEY][optimizer.name] = file_entry(optimizer)
    (newest / STATE_FILE).write_text(json.dumps(state))

    result = run_cli(
        *SCRATCH, "train.max_bad_steps=1000", "train.max_skipped_fraction=1", cwd=fresh, check=False
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert (
        "training ended with last_loss nan" in result.stderr
        and "neither exported nor marked done" in result.stderr
    )
    assert "Resuming from" in result.stderr and newest.name in result.stderr
    assert not (fresh / "work" / "nob" / "pretrain").exists()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    assert sorted(path.name for path in (partial / "checkpoints").iterdir())[-1] == "step-00000012"
    assert not (partial / "hf").exists()


def test_the_export_refuses_non_finite_weights_and_leaves_no_hf_folder(fresh, tmp_path):
    """Guard (pipeline/training/run.py `export_trained`): a trained checkpoint holding a NaN is not
    written as a transformers folder (its loss and held-out score can be finite when the NaN is in a
    row no text uses)."""
    from pipeline.training.job import EXPORT, TRAINED
    from pipeline.training.run import export_trained

    _model_with_a_nan(tmp_path / TRAINED, fresh)
    with pytest.raises(
        StageError, match="holds non-finite values .* neither exported nor marked done"
    ):
        export_trained(tmp_path, fresh / "work" / "nob" / "tokenizer", 2**30)
    assert not (tmp_path / EXPORT).exists()
