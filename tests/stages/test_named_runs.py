"""Experiments side by side through the real CLI on the packed Norwegian sample: a Hydra multirun
over the learning rate is two named runs that share every output but their own pretrain and
evaluate; a run continues another's final training state on the loss curve of an uninterrupted
run; stage=compare puts the runs' evaluate reports side by side; stage=status lists the runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CHAIN_OPTIONS, marker, packed_copy, run_cli

# The tiny model of tests/stages/test_pretrain.py, with batches of 4 sequences and a constant rate
# (after 2 warm-up steps), so that a continued run's constant rate is the uninterrupted run's.
TRAINING = (
    *CHAIN_OPTIONS,
    "model.num_layers=2",
    "model.max_seq_len=128",
    "train.schedule=constant",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "train.eval_tokens=512",
    "train.checkpoint_every=0",
    "eval.max_bytes=4000",
    "eval.heldout_tasks=false",
)
SWEPT = ("train.lr-0.001", "train.lr-0.003")
CONTINUED = ("stage=pretrain", *TRAINING, "run=continued", "init=continue:train.lr-0.001")


def _entries(nob, run: str) -> list[dict]:
    metrics = nob / "runs" / run / "pretrain" / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]


def _losses(nob, run: str) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in _entries(nob, run) if "loss" in entry}


@pytest.fixture(scope="module")
def runs(nob_packed, tmp_path_factory):
    """Two runs of a sweep over train.lr (4 steps, evaluated), an uninterrupted run of 8 steps, and
    a run that continues the first run of the sweep for 4 more steps."""
    cwd = packed_copy(nob_packed, tmp_path_factory.mktemp("named-runs"))
    sweep = (*TRAINING, "init=scratch", "train.warmup_steps=2", "train.steps=4")
    run_cli("-m", "stage=pretrain", *sweep, "train.lr=1e-3,3e-3", cwd=cwd)
    run_cli("-m", "stage=evaluate", *sweep, "train.lr=1e-3,3e-3", cwd=cwd)
    uninterrupted = ("init=scratch", "train.warmup_steps=2", "train.steps=8", "run=uninterrupted")
    run_cli("stage=pretrain", *TRAINING, *uninterrupted, cwd=cwd)
    continued = run_cli(*CONTINUED, "train.warmup_steps=0", "train.steps=4", cwd=cwd)
    return cwd, continued.stderr


def test_acceptance_a_sweep_over_the_learning_rate_trains_twice_on_one_shared_pack(runs):
    nob = runs[0] / "work" / "nob"
    pack = marker(nob.parent, "nob", "pack")["config_hash"]
    pretrained = {}
    for run in SWEPT:
        folder = nob / "runs" / run
        for stage in ("clean", "mix", "tokenizer", "pack"):
            assert (folder / stage).is_symlink() and (folder / stage).resolve() == nob / stage
        assert json.loads((folder / "pack" / "_SUCCESS.json").read_text())["config_hash"] == pack
        assert not (folder / "pretrain").is_symlink()
        pretrained[run] = json.loads((folder / "pretrain" / "_SUCCESS.json").read_text())
    assert [pretrained[run]["config"]["train"]["lr"] for run in SWEPT] == [1e-3, 3e-3]
    assert len({pretrained[run]["config_hash"] for run in SWEPT}) == 2
    assert not (nob / "pretrain").exists()  # the default run trained nothing
    assert sorted(p.name for p in (nob / "runs").iterdir()) == sorted(
        [*SWEPT, "continued", "uninterrupted"]
    )


def test_acceptance_a_continued_run_joins_the_loss_curve_of_an_uninterrupted_run(runs):
    cwd, log = runs
    nob = cwd / "work" / "nob"
    assert "Continuing from" in log and "final_state/step-00000004: step 4" in log
    uninterrupted, continued = _losses(nob, "uninterrupted"), _losses(nob, "continued")
    assert sorted(continued) == [5, 6, 7, 8]  # the steps count on from the other run's
    # Same model, optimizer state, data position and rate: the uninterrupted run's losses.
    for step in continued:
        assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-5), step
    assert _losses(nob, SWEPT[0]) == pytest.approx({s: uninterrupted[s] for s in range(1, 5)})
    entries = _entries(nob, "continued")
    assert all(entry["lr"] == pytest.approx(1e-3) for entry in entries if "loss" in entry)
    start = next(entry for entry in entries if "heldout_bpb" in entry)
    source = json.loads((nob / "runs" / SWEPT[0] / "pretrain" / "_SUCCESS.json").read_text())
    assert start["step"] == 4
    assert start["heldout_bpb"] == pytest.approx(source["metrics"]["heldout_bpb_after"])
    metrics = json.loads((nob / "runs" / "continued" / "pretrain" / "_SUCCESS.json").read_text())[
        "metrics"
    ]
    assert metrics["continued_from"] == {
        "run": SWEPT[0],
        "step": 4,
        "tokens": 4 * 4 * 128,
        "config_hash": source["config_hash"],
    }
    assert (metrics["steps"], metrics["tokens"]) == (8, 8 * 4 * 128)
    # It keeps its own final state in turn, of its last step, with the data position after it.
    state = nob / "runs" / "continued" / "pretrain" / "final_state" / "step-00000008"
    assert json.loads((state / "state.json").read_text())["sampler"]["step"] == 8


def test_acceptance_compare_lists_every_run_with_its_evaluate_numbers(runs):
    cwd = runs[0]
    nob = cwd / "work" / "nob"
    named = (*SWEPT, "continued")
    printed = run_cli("stage=compare", "lang=nob", f"runs=[{','.join(named)}]", cwd=cwd).stdout
    assert str(nob / "compare" / "report.md") in printed
    report = json.loads((nob / "compare" / "report.json").read_text())
    text = (nob / "compare" / "report.md").read_text()
    assert report["runs"] == list(named) and (nob / "compare" / "bpb.png").stat().st_size > 1000
    assert "continued" in report["not_evaluated"] and "**continued: not evaluated**" in text
    for run in SWEPT:
        evaluated = json.loads((nob / "runs" / run / "evaluate" / "report.json").read_text())
        for name, result in evaluated["scores"]["pretrain"].items():
            shown = report["scores"][run]["pretrain"][name]
            assert shown["bits_per_byte"] == result["bits_per_byte"]
            assert shown["interval_95"] == result["interval_95"]
            assert f"{result['bits_per_byte']:.4f}" in text
    assert report["settings"]["train.lr"] == {SWEPT[0]: 1e-3, SWEPT[1]: 3e-3, "continued": 1e-3}
    assert report["settings"]["init"]["continued"] == f"continue:{SWEPT[0]}"
    assert report["cost"]["continued"]["tokens"] == 8 * 4 * 128
    assert report["continued_from"]["continued"]["run"] == SWEPT[0]
    assert report["shares"][SWEPT[0]]["pack"] == "default"
    status = run_cli("stage=status", "lang=nob", cwd=cwd).stdout
    assert f"nob {SWEPT[1]}: clean, mix, tokenizer, pack, pretrain, evaluate" in status
    assert "nob continued: clean, mix, tokenizer, pack, pretrain; shared:" in status
    assert f"continues {SWEPT[0]} from step 4" in status


def test_a_bad_run_name_and_a_run_that_cannot_be_continued_are_refused(runs):
    cwd = runs[0]
    refused = run_cli("stage=pretrain", *TRAINING, "run=../x", cwd=cwd, check=False)
    assert refused.returncode == 1 and "Invalid value for `run`: '../x'" in refused.stderr
    missing = run_cli(
        "stage=pretrain", *TRAINING, "run=later", "init=continue:nothere", cwd=cwd, check=False
    )
    assert missing.returncode == 1
    assert "run `nothere` has no finished pretrain for nob" in missing.stderr
    assert "python -m pipeline stage=pretrain lang=nob run=nothere" in missing.stderr
    assert f"init=continue:{SWEPT[0]}" in missing.stderr
    assert not (cwd / "work" / "nob" / "runs" / "later" / "pretrain").exists()
