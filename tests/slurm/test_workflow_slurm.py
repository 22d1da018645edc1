"""stage=workflow on a real one-node Slurm (tests/slurm/start_local_slurm.sh): the whole recipe for
Norwegian, Faroese and a language without raw text (Danish) with a small base model: English's clean
and the base's replay once, before every language's mix; Norwegian cancelled mid-chain and finished
by running the same command again; the pretrain task of Faroese preempted (SIGUSR1), requeued and
resumed from its checkpoint; Danish failing alone, named by stage=status with its log; and the
markers the workflow leaves are the ones stage=all expects (it skips every step)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.config import STAGE_NAMES
from pipeline.stages import RECIPE_STAGES
from tests.conftest import marker, run_cli

# Table indices: Faroese runs through; Norwegian is cancelled at `mix`; Danish has no raw text;
# English is the base's.
KEPT, CANCELLED, EMPTY, BASE = ("fao", 75), ("nob", 47), ("dan", 9), ("eng", 12)
# Tiny settings; the model's shape is the base's (tests/english_base_model.py). Pretrain has steps
# enough to be signalled while it trains (at up to 25 steps/s on 2 idle cores: seconds, also when
# the other test process slows the signal's sender down).
OPTIONS = (
    "tokenizer.vocab_size=512",
    "clean.dedup.enabled=false",
    "model.num_layers=2",
    "model.max_seq_len=128",
    "replay.tokens=3000",
    "replay.length=64",
    "tokenizer.added_tokens=64",
    "warmup.train.steps=2",
    "warmup.train.global_batch_size=4",
    "warmup.train.micro_batch_size=2",
    "warmup.train.eval_tokens=512",
    "train.steps=120",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "train.eval_tokens=512",
    "train.log_every=1",
    "eval.max_bytes=20000",
)
LANGUAGES_OF_TEST = ("nob", "fao", "dan")


@pytest.fixture(scope="module")
def small_base(tmp_path_factory) -> Path:
    """An English base model of the right shape; 20 training steps (it only has to be a valid
    model)."""
    from tests.english_base_model import build_english_base

    return build_english_base(tmp_path_factory.mktemp("base") / "english", steps=20)


def slurm_tasks() -> dict[str, tuple[str, str]]:
    """ "<job>_<index>" -> (state, reason) of this user's array tasks."""
    out = subprocess.run(
        ["squeue", "--me", "--noheader", "--array", "--states=all", "--format=%F_%K|%T|%r"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        task: (state, reason)
        for task, state, reason in (line.split("|") for line in out.splitlines())
    }


def submissions(work: Path) -> list[dict]:
    return json.loads((work / ".workflow" / "state.json").read_text())["submissions"]


def task_of(work: Path, stage: str, index: int) -> str:
    job = next(
        s["job_id"]
        for s in reversed(submissions(work))
        if s["stage"] == stage and str(index) in s["tasks"]
    )
    return f"{job}_{index}"


def wait_until(condition, what: str, seconds: float, details=lambda: "", poll: float = 0.5) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s: {details()}"
        time.sleep(poll)


def status_rows(cwd: Path, work: Path) -> dict[str, list[str]]:
    """stage=status as {language: [cell per column]} (rows start with the code and the language's
    name; the base language's row is marked `(base)`, and its empty cells are blank)."""
    out = run_cli(
        "stage=status", f"langs=[{','.join(LANGUAGES_OF_TEST)}]", f"work_dir={work}", cwd=cwd
    ).stdout
    lines = out.splitlines()
    first = next(number for number, line in enumerate(lines) if line.startswith("language"))
    starts = [lines[first].index(column) for column in lines[first].split()[1:]]
    rows = {}
    for line in lines[first + 1 :]:
        if line.startswith("-"):  # the table's last rule
            break
        rows[line.split()[0]] = [
            line[start:].split()[0] if line[start : start + 1].strip() else "" for start in starts
        ]
    return rows


def test_three_languages_run_through_the_recipe_with_a_cancel_a_preemption_and_an_empty_language(
    tmp_path, slurm_cluster, small_base
):
    work = (
        tmp_path / "work space"
    )  # a path with a space: sbatch options, scripts and Hydra must all cope
    command = (
        "stage=workflow",
        f"langs=[{','.join(LANGUAGES_OF_TEST)}]",
        f"model.base={small_base}",
        f"work_dir={work}",
        *OPTIONS,
    )
    first = run_cli(*command, cwd=tmp_path).stdout
    assert f"{len(RECIPE_STAGES) + 1} job array(s)" in first
    chain = submissions(work)
    # English's clean and the replay once, as arrays of one task (English is not a language of the
    # run); every mix waits for both tasks.
    assert [(s["stage"], s["tasks"]) for s in chain[:2]] == [
        ("clean", {str(BASE[1]): "eng"}),
        ("replay", {str(BASE[1]): "eng"}),
    ]
    english_clean, replay = chain[0]["job_id"], chain[1]["job_id"]
    by_stage = {s["stage"]: s for s in chain[2:]}
    assert list(by_stage) == list(STAGE_NAMES)
    languages = {str(index): code for code, index in (KEPT, CANCELLED, EMPTY)}
    assert all(by_stage[stage]["tasks"] == languages for stage in STAGE_NAMES)
    clean = by_stage["clean"]["job_id"]
    assert (
        by_stage["mix"]["dependency"]
        == f"aftercorr:{clean},afterok:{english_clean}_{BASE[1]},afterok:{replay}_{BASE[1]}"
    )

    # Danish fails alone at its clean, with a message that names it and the cause; its later tasks
    # never start.
    # noqa: E731
    dan_log = lambda: work / ".workflow" / "logs" / f"clean_{task_of(work, 'clean', EMPTY[1])}.log"
    wait_until(
        lambda: dan_log().is_file() and "No raw input for dan" in dan_log().read_text(),
        "Danish's clean",
        120,
        lambda: str(slurm_tasks()),
    )
    # Cancel Norwegian's `mix` while it waits: the tasks after it can never start.
    cancelled = task_of(work, "mix", CANCELLED[1])
    subprocess.run(["scancel", cancelled], check=True)
    rows = status_rows(tmp_path, work)
    assert rows["nob"][2:] == ["-"] * (len(STAGE_NAMES) - 1), (
        rows
    )  # not started (its tasks are stuck)
    assert "FAILED" not in rows["fao"] and rows["dan"][0] == "FAILED", rows

    # The same command again: Norwegian's stages from `mix` on, after its `clean` task and the
    # base's tasks (still queued or running, or done), and Danish's whole chain again; Faroese's
    # queued tasks are not submitted twice, Norwegian's and Danish's stuck ones are cancelled.
    run_cli(*command, cwd=tmp_path)
    again = submissions(work)[len(chain) :]
    by_language = {
        code: [s for s in again if s["tasks"] == {str(index): code}]
        for code, index in (CANCELLED, EMPTY)
    }
    assert sum(map(len, by_language.values())) == len(again)
    assert [s["stage"] for s in by_language["nob"]] == list(STAGE_NAMES[1:])
    assert [s["stage"] for s in by_language["dan"]] == list(STAGE_NAMES)
    waits = (by_language["nob"][0]["dependency"] or "").split(",")
    assert set(waits) <= {
        f"aftercorr:{clean}",
        f"afterok:{english_clean}_{BASE[1]}",
        f"afterok:{replay}_{BASE[1]}",
        "",
    }
    for runs in by_language.values():
        assert [s["dependency"].split(",")[0] for s in runs[1:]] == [
            f"aftercorr:{s['job_id']}" for s in runs[:-1]
        ]

    # Preempt Faroese's pretrain while it trains: the batch shell passes SIGUSR1 on, the stage saves
    # a checkpoint and exits with 75, the script requeues the task, and the task resumes from the
    # checkpoint.
    pretrain = task_of(work, "pretrain", KEPT[1])
    metrics = lambda: list(work.glob("fao/.pretrain.partial-*/metrics.jsonl"))  # noqa: E731
    # The held-out score before step 1 is logged just before the ranks start to listen for the
    # signal.
    wait_until(
        lambda: metrics() and '"heldout_bpb"' in metrics()[0].read_text(),
        "fao's pretrain start",
        300,
        lambda: str(slurm_tasks()),
        poll=0.1,
    )
    time.sleep(0.3)
    subprocess.run(["scancel", "--batch", "--signal=USR1", pretrain], check=True)
    wait_until(
        lambda: slurm_tasks().get(pretrain, ("",))[0] == "PENDING",
        "the requeue",
        60,
        lambda: str(slurm_tasks()),
    )
    # Slurm holds a requeued job back for two minutes; the test waits only until the node has let go
    # of the old run (a start in the same second finds its credential revoked).
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={pretrain}", "StartTime=now"], check=True)

    evaluated = lambda: all(
        (work / code / "evaluate" / "_SUCCESS.json").exists() for code in ("fao", "nob")
    )  # noqa
    wait_until(
        evaluated,
        "both chains",
        300,
        lambda: (
            f"{slurm_tasks()}\n"
            + "\n".join(
                f"{p.name}: {p.read_text()[-1500:]}"
                for p in sorted((work / ".workflow" / "logs").glob("*_*_*.log"))
            )
        ),
    )
    log = (work / ".workflow" / "logs" / f"pretrain_{pretrain}.log").read_text()
    assert "saved a checkpoint and stopped: requeueing it to resume" in log
    resumed_at = int(log.split("Resuming from")[1].split("(step ")[1].split()[0])
    assert 0 < resumed_at < 120
    assert marker(work, "fao", "pretrain")["metrics"]["steps"] == 120
    # The one replay served both languages: their mix plans read it.
    for code in ("fao", "nob"):
        assert "eng-samples" in marker(work, code, "mix")["metrics"]["tokens"]

    # Danish failed alone again; stage=status names it with its log.
    wait_until(lambda: "No raw input for dan" in dan_log().read_text(), "Danish's second clean", 60)
    rows = status_rows(tmp_path, work)
    assert rows == {
        "eng": ["done", "done"] + [""] * (len(STAGE_NAMES) - 1),
        **{code: ["done", ""] + ["done"] * (len(STAGE_NAMES) - 1) for code in ("fao", "nob")},
        "dan": ["FAILED", ""] + ["-"] * (len(STAGE_NAMES) - 1),
    }, rows
    status = run_cli(
        "stage=status", f"langs=[{','.join(LANGUAGES_OF_TEST)}]", f"work_dir={work}", cwd=tmp_path
    ).stdout
    assert f"  dan clean: {dan_log()}" in status
    last = run_cli(*command, cwd=tmp_path).stdout  # only Danish's chain is submitted again
    assert f"{len(STAGE_NAMES)} to submit" in last
    subprocess.run(
        ["scancel", *(s["job_id"] for s in submissions(work)[len(chain) + len(again) :])],
        check=True,
    )

    # The markers are the ones stage=all leaves for the same settings: it finds every step of its
    # recipe up to date.
    for code in ("fao", "nob"):
        again_all = run_cli(
            "stage=all",
            f"lang={code}",
            f"model.base={small_base}",
            f"work_dir={work}",
            *OPTIONS,
            cwd=tmp_path,
        )
        assert "Running" not in again_all.stderr, again_all.stderr[-3000:]
        skipped = {
            line.split("Skipping ")[1].split(":")[0]
            for line in again_all.stderr.splitlines()
            if "Skipping " in line
        }
        assert skipped == {
            "clean for eng",
            "replay for eng",
            *(f"{stage} for {code}" for stage in STAGE_NAMES),
        }
