"""stage=workflow on a real one-node Slurm (tests/slurm/start_local_slurm.sh): the whole chain for two small
languages with the tiny model, one language cancelled mid-chain and finished by running the same command again,
and the pretrain task of the other preempted (SIGUSR1), requeued and resumed from its checkpoint."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.config import STAGE_NAMES
from tests.conftest import marker, run_cli

# Faroese (table index 75) runs through; Icelandic (29) is cancelled at `mix`.
KEPT, CANCELLED = ("fao", 75), ("isl", 29)
# Tiny settings; the model's shape is the base's (tests/english_base_model.py). Pretrain has steps enough to be
# signalled while it trains (at up to 25 steps/s on 2 idle cores: seconds, also when the other test process
# slows the signal's sender down).
OPTIONS = ("tokenizer.vocab_size=512", "clean.dedup.enabled=false", "model.num_layers=2", "model.max_seq_len=128",
           "warmup.train.steps=2", "warmup.train.global_batch_size=4", "warmup.train.micro_batch_size=2",
           "warmup.train.eval_tokens=512", "train.steps=120", "train.global_batch_size=4", "train.micro_batch_size=2",
           "train.eval_tokens=512", "train.log_every=1", "eval.max_bytes=20000")


@pytest.fixture(scope="module")
def small_base(tmp_path_factory) -> Path:
    """An English base model of the right shape; 20 training steps (it only has to be a valid model)."""
    from tests.english_base_model import build_english_base

    return build_english_base(tmp_path_factory.mktemp("base") / "english", steps=20)


def slurm_tasks() -> dict[str, tuple[str, str]]:
    """"<job>_<index>" -> (state, reason) of this user's array tasks."""
    out = subprocess.run(["squeue", "--me", "--noheader", "--array", "--states=all", "--format=%F_%K|%T|%r"],
                         capture_output=True, text=True, check=True).stdout
    return {task: (state, reason) for task, state, reason in (line.split("|") for line in out.splitlines())}


def submissions(work: Path) -> list[dict]:
    return json.loads((work / ".workflow" / "state.json").read_text())["submissions"]


def task_of(work: Path, stage: str, index: int) -> str:
    job = next(s["job_id"] for s in reversed(submissions(work)) if s["stage"] == stage and str(index) in s["tasks"])
    return f"{job}_{index}"


def wait_until(condition, what: str, seconds: float, details=lambda: "", poll: float = 0.5) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s: {details()}"
        time.sleep(poll)


def status_rows(cwd: Path, work: Path) -> dict[str, list[str]]:
    """stage=status as {language: [cell per stage]} (rows start with the code and the language's name)."""
    out = run_cli("stage=status", "langs=[fao,isl]", f"work_dir={work}", cwd=cwd).stdout
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ("fao", "isl"):
            rows[words[0]] = words[2:]
    return rows


def test_two_languages_run_through_with_a_cancel_and_a_preemption(tmp_path, slurm_cluster, small_base):
    work = tmp_path / "work space"  # a path with a space: sbatch options, scripts and Hydra must all cope
    command = ("stage=workflow", "langs=[fao,isl]", f"model.base={small_base}", f"work_dir={work}", *OPTIONS)
    first = run_cli(*command, cwd=tmp_path).stdout
    assert f"{len(STAGE_NAMES)} job array(s)" in first
    chain = submissions(work)
    assert [s["stage"] for s in chain] == list(STAGE_NAMES)
    assert all(s["tasks"] == {"29": "isl", "75": "fao"} for s in chain)

    # Cancel Icelandic's `mix` while it waits for its `clean`: the tasks after it can never start.
    cancelled = task_of(work, "mix", CANCELLED[1])
    subprocess.run(["scancel", cancelled], check=True)
    rows = status_rows(tmp_path, work)
    assert rows["isl"][1:] == ["-"] * (len(STAGE_NAMES) - 1), rows  # not started (its tasks are stuck)
    assert "FAILED" not in rows["fao"], rows

    # The same command again: only Icelandic's stages from `mix` on, after its `clean` task (still queued or
    # running); Faroese's queued tasks are not submitted twice, Icelandic's stuck ones are cancelled.
    run_cli(*command, cwd=tmp_path)
    again = submissions(work)[len(chain):]
    assert [s["stage"] for s in again] == list(STAGE_NAMES[1:])
    assert all(s["tasks"] == {"29": "isl"} for s in again)
    clean_job = chain[0]["job_id"]
    assert again[0]["dependency"] in (None, f"aftercorr:{clean_job}")  # None if isl's clean finished already
    assert [s["dependency"] for s in again[1:]] == [f"aftercorr:{s['job_id']}" for s in again[:-1]]

    # Preempt Faroese's pretrain while it trains: the batch shell passes SIGUSR1 on, the stage saves a
    # checkpoint and exits with 75, the script requeues the task, and the task resumes from the checkpoint.
    pretrain = task_of(work, "pretrain", KEPT[1])
    metrics = lambda: list(work.glob("fao/.pretrain.partial-*/metrics.jsonl"))  # noqa: E731
    # The held-out score before step 1 is logged just before the ranks start to listen for the signal.
    wait_until(lambda: metrics() and '"heldout_bpb"' in metrics()[0].read_text(), "fao's pretrain start", 200,
               lambda: str(slurm_tasks()), poll=0.1)
    time.sleep(0.3)
    subprocess.run(["scancel", "--batch", "--signal=USR1", pretrain], check=True)
    wait_until(lambda: slurm_tasks().get(pretrain, ("",))[0] == "PENDING", "the requeue", 60,
               lambda: str(slurm_tasks()))
    # Slurm holds a requeued job back for two minutes; the test waits only until the node has let go of the
    # old run (a start in the same second finds its credential revoked).
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={pretrain}", "StartTime=now"], check=True)

    evaluated = lambda: all((work / code / "evaluate" / "_SUCCESS.json").exists() for code in ("fao", "isl"))  # noqa
    wait_until(evaluated, "both chains", 240, lambda: f"{slurm_tasks()}\n" + "\n".join(
        f"{p.name}: {p.read_text()[-1500:]}" for p in sorted((work / ".workflow" / "logs").glob("*_*_*.log"))))
    log = (work / ".workflow" / "logs" / f"pretrain_{pretrain}.log").read_text()
    assert "saved a checkpoint and stopped: requeueing it to resume" in log
    resumed_at = int(log.split("Resuming from")[1].split("(step ")[1].split()[0])
    assert 0 < resumed_at < 120
    assert marker(work, "fao", "pretrain")["metrics"]["steps"] == 120

    rows = status_rows(tmp_path, work)
    assert rows == {code: ["done"] * len(STAGE_NAMES) for code in ("fao", "isl")}, rows
    last = run_cli(*command, cwd=tmp_path).stdout
    assert "0 to submit" in last and len(submissions(work)) == len(chain) + len(again)
