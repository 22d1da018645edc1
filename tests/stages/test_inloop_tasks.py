"""Downstream tasks in the training loop (`train.eval_tasks`) through the real CLI: a pretrain of the
tiny model scores a small belebele file with the held-out text, before the first step, every
`train.eval_every` steps and after the last, in one process and on two pipeline stages (gloo); the
log-likelihood of each (prompt, choice) pair at the end, and so the accuracies, are those that
stage=evaluate's scoring of the exported model gives. A name that no task has fails at start."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.evaluation.eval_config import EvalConfig, TaskConfig
from pipeline.evaluation.models import load_model, score_tasks
from pipeline.evaluation.task_files import read_task
from pipeline.evaluation.task_scoring import (
    ScoringModel,
    choice_pairs,
    continuation_log_likelihoods,
)
from pipeline.training.inloop_tasks import pack_sequences
from pipeline.training.train_config import validate_eval_tasks
from tests.conftest import CHAIN_OPTIONS, marker, packed_copy, run_cli
from tests.stages.test_pretrain import TINY

# belebele's fields; the last passage is longer than the 128-token window, so its prompts lose their
# start (and fill a row each), the others share rows.
ITEMS = [
    (
        "Oslo er hovedstaden i Norge.",
        "Hva er hovedstaden?",
        ("Bergen", "Oslo", "Tromsø", "Bodø"),
        2,
    ),
    (
        "Stortinget vedtok loven etter en lang debatt.",
        "Hvem vedtok loven?",
        ("Regjeringen", "Kongen", "Stortinget", "Høyesterett"),
        3,
    ),
    ("Hun løp fort og vant løpet.", "Hva gjorde hun?", ("Vant", "Tapte", "Sov", "Svømte"), 1),
    ("Det regnet hele dagen i Bergen.", "Hvordan var været?", ("Sol", "Regn", "Snø", "Tåke"), 2),
    (
        "Regjeringen la fram budsjettet for neste år. " * 30,
        "Hva la regjeringen fram?",
        ("Budsjettet", "Loven", "Planen", "Talen"),
        1,
    ),
]
NAME = "bokmal_belebele"


def write_belebele(path):
    with open(path, "w", encoding="utf-8") as handle:
        for passage, question, answers, correct in ITEMS:
            record = {"flores_passage": passage, "question": question}
            record.update({f"mc_answer{i + 1}": answer for i, answer in enumerate(answers)})
            record["correct_answer_num"] = str(correct)
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def options(task_file) -> tuple[str, ...]:
    return (
        "stage=pretrain",
        *CHAIN_OPTIONS,
        *TINY,
        "init=scratch",
        "train.steps=4",
        "train.eval_every=2",
        "train.checkpoint_every=0",
        f"eval.tasks=[{{layout:belebele,path:{task_file},language:nob,name:{NAME}}}]",
        f"train.eval_tasks=[{NAME}]",
    )


@pytest.mark.parametrize(
    "layout", ["parallel.pp=1", "parallel.pp=2", "parallel.tp=2", "parallel.dp=2"]
)
def test_acceptance_tasks_scored_in_the_loop_are_those_the_exported_model_scores(
    nob_packed, tmp_path, layout
):
    task_file = write_belebele(tmp_path / "nob_Latn.jsonl")
    cwd = packed_copy(nob_packed, tmp_path / "run")
    run_cli(*options(task_file), layout, cwd=cwd)
    folder = cwd / "work" / "nob" / "pretrain"
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    scored = [entry for entry in map(json.loads, lines) if "tasks" in entry]
    assert [entry["step"] for entry in scored] == [0, 2, 4]
    assert all("heldout_bpb" in entry and list(entry["tasks"]) == [NAME] for entry in scored)
    metrics = marker(cwd / "work", "nob", "pretrain")["metrics"]
    assert metrics["tasks_before"] == scored[0]["tasks"]
    assert metrics["tasks_after"] == scored[-1]["tasks"]
    assert metrics["tasks_scored"][NAME] == {"questions": 5, "sequences": 5 * 4 + 4}

    # stage=evaluate's reading of the exported model: its window, its start token, its scoring.
    loaded = load_model("pretrain", str(folder / "hf"), EvalConfig(), "nob", torch.device("cpu"))
    config = TaskConfig(layout="belebele", path=str(task_file), language="nob", name=NAME)
    task = read_task(config, tmp_path / "scratch")
    pairs, alone, _ = choice_pairs(task.questions)
    scorer = ScoringModel(
        loaded.model, loaded.tokenizer, loaded.start_id, loaded.seq_len, 8, torch.device("cpu")
    )
    expected = continuation_log_likelihoods(scorer, [*pairs, *alone])
    in_loop = np.load(folder / "task_log_likelihoods.npy", allow_pickle=False)
    assert in_loop.tolist() == pytest.approx(expected, rel=1e-4, abs=1e-4)
    evaluated = score_tasks(loaded, [task], 8, "nob", torch.device("cpu"))[NAME]
    assert scored[-1]["tasks"][NAME] == {
        metric: accuracy.accuracy for metric, accuracy in evaluated.items()
    }
    assert list(evaluated) == ["acc", "acc_norm", "acc_bytes", "acc_mutual_info"]


def test_a_name_no_task_has_fails_at_start(tmp_path):
    task_file = write_belebele(tmp_path / "nob_Latn.jsonl")
    result = run_cli(
        *options(task_file)[:-1], "train.eval_tasks=[belebele]", cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    assert (
        f"Invalid value for `train.eval_tasks`: 'belebele'. Allowed: a task of eval.tasks by its "
        f"name: {NAME}" in result.stderr
    )
    assert not list((tmp_path / "work" / "nob").glob("*pretrain*"))


def test_a_held_out_set_is_refused_with_the_reason(tmp_path):
    flores = TaskConfig(layout="flores200", path=str(tmp_path), language="nob", name="flores")
    with pytest.raises(ConfigError, match="warmup.train logs held-out bits per byte already"):
        validate_eval_tasks(["flores"], [flores], "warmup.train")


def test_each_packed_pair_scores_a_run_of_labels_of_its_own():
    # (tokens, scored) as scored_sequences gives them: pairs with an empty prompt score every label,
    # so two of them side by side would make one run without the position between them; the fourth
    # fills a row of 8 inputs alone.
    sequences = [
        ([1, 5, 6], 2),
        ([1, 7], 1),
        ([1, 8, 9, 10], 3),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 2),
        ([1, 11], 1),
    ]
    inputs, labels, segments, row_sequences = pack_sequences(sequences, seq_len=8)
    assert row_sequences.tolist() == [0, 3, 4, 5] and inputs.shape == labels.shape == (3, 8)
    runs = []
    for row in labels:
        scored = np.concatenate([[0], row != -100, [0]]).astype(np.int8)
        bounds = np.flatnonzero(np.diff(scored))
        runs += [row[begin:end].tolist() for begin, end in zip(bounds[::2], bounds[1::2])]
    assert runs == [whole[-count:] for whole, count in sequences]
    # each pair attends to itself only, and reads its tokens but the last
    assert inputs[0].tolist() == [1, 5, 0, 1, 0, 1, 8, 9] and segments[0].tolist()[:5] == [
        0,
        0,
        1,
        2,
        3,
    ]
    assert inputs[1].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
