"""results.json in lm-evaluation-harness' layout: the fields its `simple_evaluate` returns and its
EvaluationTracker writes (lm_eval/evaluator.py, evaluator_utils.py `_collect_results`,
result_schema.py), written out here field by field, with the values and standard errors computed by
hand (lm_eval/api/metrics.py: `mean_stderr` = sample standard deviation / sqrt(n))."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from pipeline.evaluation.lm_eval_results import (
    accuracy_stderr,
    lm_eval_results,
    models_in_report,
    write_lm_eval_results,
)

# What `_collect_results` puts in each task's entry besides its metrics.
TASK_FIELDS = {"name", "alias", "sample_len"}
TOP_LEVEL = {
    "results",
    "group_subtasks",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
    "config",
    "date",
    "model_source",
    "model_name",
}


def _accuracy(outcomes: list[int]) -> dict:
    return {"accuracy": sum(outcomes) / len(outcomes), "correct": sum(outcomes), "n": len(outcomes)}


BELEBELE = {"acc": _accuracy([1, 1, 1, 0]), "acc_norm": _accuracy([1, 0, 0, 0])}
SOURCE = {"linear_probe_acc": _accuracy([1, 1, 0]), "acc": _accuracy([0, 1, 0])}
HELDOUT = {"bits_per_byte": 1.5, "documents": 10, "bytes": 1234, "text": "the held-out split"}


def _report() -> dict:
    """The parts of an evaluate report.json that results.json is made from."""

    def task(layout, results, **about):
        return {"layout": layout, "path": f"/data/{layout}", **about, "results": results}

    return {
        "models": {"base": "/models/base", "pretrain": "work/nob/pretrain/hf"},
        "sets": {"heldout": {"title": "held-out split", "text": "the held-out split"}},
        "scores": {"base": {"heldout": HELDOUT}, "pretrain": {"heldout": HELDOUT}},
        "tasks": {
            "nob_Latn": task("belebele", {"base": BELEBELE, "pretrain": BELEBELE}, test=4),
            "source": task("sib200", {"base": SOURCE, "pretrain": SOURCE}, k=5, test=3),
        },
    }


def _stderr(outcomes: list[int]) -> float:
    return statistics.stdev(outcomes) / math.sqrt(len(outcomes))


def test_the_standard_error_is_the_harness_mean_stderr():
    assert accuracy_stderr(3, 4) == pytest.approx(_stderr([1, 1, 1, 0]))
    assert accuracy_stderr(0, 7) == 0.0
    assert accuracy_stderr(1, 1) == "N/A"  # the harness computes none for one item


def test_every_field_of_the_harness_results_file():
    about = models_in_report(_report())["pretrain"]
    results = lm_eval_results(
        about["folder"], about["tasks"], about["sets"], about["task_about"], date=1.5e9
    )
    assert set(results) == TOP_LEVEL
    assert results["results"]["nob_Latn"] == {
        "name": "nob_Latn",
        "alias": "nob_Latn",
        "sample_len": 4,
        "acc,none": 0.75,
        "acc_stderr,none": pytest.approx(_stderr([1, 1, 1, 0])),
        "acc_norm,none": 0.25,
        "acc_norm_stderr,none": pytest.approx(_stderr([1, 0, 0, 0])),
    }
    assert results["results"]["source"]["linear_probe_acc,none"] == pytest.approx(2 / 3)
    # A bits-per-byte set as the harness' loglikelihood_rolling tasks (wikitext) report it.
    assert results["results"]["heldout"] == {
        "name": "heldout",
        "alias": "heldout",
        "sample_len": 10,
        "bits_per_byte,none": 1.5,
        "bits_per_byte_stderr,none": "N/A",
        "byte_perplexity,none": pytest.approx(2**1.5),
        "byte_perplexity_stderr,none": "N/A",
    }
    assert results["versions"] == {"heldout": None, "nob_Latn": 0.0, "source": None}
    assert results["n-shot"] == {"heldout": 0, "nob_Latn": 0, "source": 5}
    assert results["higher_is_better"] == {
        "heldout": {"byte_perplexity": False, "bits_per_byte": False},
        "nob_Latn": {"acc": True, "acc_norm": True},
        "source": {"linear_probe_acc": True, "acc": True},
    }
    assert results["n-samples"] == {
        "nob_Latn": {"original": 4, "effective": 4},
        "source": {"original": 3, "effective": 3},
        "heldout": {"original": 10, "effective": 10},
    }
    config = results["configs"]["nob_Latn"]
    assert (config["task"], config["output_type"], config["num_fewshot"]) == (
        "nob_Latn",
        "multiple_choice",
        0,
    )
    assert config["metric_list"] == [
        {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
    ]
    assert results["configs"]["heldout"]["output_type"] == "loglikelihood_rolling"
    assert results["config"] == {"model": "hf", "model_args": "pretrained=work/nob/pretrain/hf"}
    assert results["date"] == 1.5e9 and results["group_subtasks"] == {}


def _table_rows(results: dict) -> list[tuple]:
    """What lm_eval.utils.make_table reads of each entry: alias, version, n-shot, and each
    `metric,filter` key with its `metric_stderr,filter` partner."""
    rows = []
    for name, entry in results["results"].items():
        metrics = {k: v for k, v in entry.items() if k not in TASK_FIELDS}
        for key, value in sorted(metrics.items()):
            metric, _, kept = key.partition(",")
            if metric.endswith("_stderr"):
                continue
            stderr = metrics[f"{metric}_stderr,{kept}"]
            version, shots = results["versions"].get(name), results["n-shot"][name]
            better = results["higher_is_better"][name][metric]
            rows.append((entry["alias"], version, kept, shots, metric, better, value, stderr))
    return rows


def test_results_files_for_each_model_and_the_last(tmp_path):
    written = write_lm_eval_results(tmp_path, models_in_report(_report()))
    assert [path.name for path in written] == [
        "results_base.json",
        "results_pretrain.json",
        "results.json",
    ]
    last = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert last == json.loads((tmp_path / "results_pretrain.json").read_text(encoding="utf-8"))
    base = json.loads((tmp_path / "results_base.json").read_text(encoding="utf-8"))
    assert base["config"]["model_args"] == "pretrained=/models/base"
    assert len(_table_rows(last)) == 2 + 2 + 2  # belebele's, source's and heldout's metrics
