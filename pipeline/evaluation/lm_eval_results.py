"""The evaluate stage's scores in the layout of lm-evaluation-harness' results file, so that what
reads those files (`lm_eval.utils.make_table`, leaderboard scripts) reads ours: the layout that
`simple_evaluate` returns and `EvaluationTracker.save_results_aggregated` writes (lm_eval/
evaluator.py, evaluator_utils.py, result_schema.py).

- `results[task]`: `name`, `alias`, `sample_len` (items scored) and `<metric>,none` with
  `<metric>_stderr,none` (`none`: the harness' filter when none is applied). An accuracy's standard
  error is the harness' `mean_stderr` of the items' 0/1 scores: their sample standard deviation (n -
  1) over the square root of n; "N/A" for a single item, as there.
- A bits-per-byte set is a `loglikelihood_rolling` task as the harness' wikitext is: `bits_per_byte`
  and `byte_perplexity` (2 to the bits per byte), their standard errors "N/A" (the harness computes
  none for those aggregations); `word_perplexity` is left out, for the stage counts no words.
- `versions`: the harness' version of the task whose prompt a layout follows (its YAML's
  `metadata.version`); null for our own layouts and sets. `n-shot`, `higher_is_better`, `n-samples`
  (`original` = `effective`: every item is scored), `configs` (the task, its file, output type,
  few-shot count, delimiters and metrics), `config` (`model: hf`, `model_args: pretrained=<folder>`),
  `date` (seconds since the epoch), and `model_source`/`model_name` as the tracker adds them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

from pipeline.evaluation.standard_tasks import FEWSHOT_DELIMITER, TARGET_DELIMITER
from pipeline.json_files import write_json_atomic

RESULTS_FILE = "results.json"
NO_FILTER = "none"
NOT_AVAILABLE = "N/A"
# The harness' metadata.version of the task YAMLs whose prompts the layouts follow
# (lm_eval/tasks/belebele/_default_template_yaml, xnli/xnli_common_yaml,
# xstorycloze/default_ar.yaml, global_mmlu/full/<lang>/_<lang>_template_yaml).
HARNESS_VERSIONS = {"belebele": 0.0, "xnli": 1.0, "xstorycloze": 1.0, "global_mmlu": 0.0}
BITS_PER_BYTE_METRICS = (
    ("byte_perplexity", "weighted_perplexity"),
    ("bits_per_byte", "bits_per_byte"),
)


def _key(metric: str) -> str:
    return f"{metric},{NO_FILTER}"


def _stderr_key(metric: str) -> str:
    return f"{metric}_stderr,{NO_FILTER}"


def accuracy_stderr(correct: int, n: int) -> float | str:
    """The standard error of a mean of n 0/1 scores with `correct` ones, as the harness computes it
    (lm_eval/api/metrics.py, mean_stderr: the sample standard deviation over sqrt(n))."""
    if n < 2:
        return NOT_AVAILABLE
    share = correct / n
    sample_variance = (correct * (1 - share) ** 2 + (n - correct) * share**2) / (n - 1)
    return math.sqrt(sample_variance / n)


def _task_results(name: str, by_metric: dict[str, dict]) -> dict:
    n = next(iter(by_metric.values()))["n"]
    entry = {"name": name, "alias": name, "sample_len": n}
    for metric, result in by_metric.items():
        entry[_key(metric)] = result["accuracy"]
        entry[_stderr_key(metric)] = accuracy_stderr(result["correct"], result["n"])
    return entry


def _set_results(name: str, score: dict) -> dict:
    return {
        "name": name,
        "alias": name,
        "sample_len": score["documents"],
        _key("bits_per_byte"): score["bits_per_byte"],
        _stderr_key("bits_per_byte"): NOT_AVAILABLE,
        _key("byte_perplexity"): 2.0 ** score["bits_per_byte"],
        _stderr_key("byte_perplexity"): NOT_AVAILABLE,
    }


def _task_config(name: str, about: dict, metrics: list[str], shots: int) -> dict:
    return {
        "task": name,
        "dataset_path": about.get("path"),
        "output_type": "multiple_choice",
        "num_fewshot": shots,
        "target_delimiter": TARGET_DELIMITER,
        "fewshot_delimiter": FEWSHOT_DELIMITER,
        "metric_list": [
            {"metric": metric, "aggregation": "mean", "higher_is_better": True}
            for metric in metrics
        ],
        "metadata": {"version": HARNESS_VERSIONS.get(about.get("layout"))},
    }


def _set_config(name: str, score: dict) -> dict:
    return {
        "task": name,
        "dataset_path": score.get("text"),
        "output_type": "loglikelihood_rolling",
        "num_fewshot": 0,
        "metric_list": [
            {"metric": metric, "aggregation": aggregation, "higher_is_better": False}
            for metric, aggregation in BITS_PER_BYTE_METRICS
        ],
        "metadata": {"version": None},
    }


def lm_eval_results(
    model_folder: str,
    task_results: dict[str, dict[str, dict]],
    set_scores: dict[str, dict],
    task_about: Optional[dict[str, dict]] = None,
    date: Optional[float] = None,
) -> dict:
    """One model's results file as lm-evaluation-harness writes it, from its task results (task ->
    metric -> {accuracy, correct, n}), its held-out sets' scores (set -> {bits_per_byte, documents,
    and `text`, where it is read from, if known}) and what each task is (task -> {layout, path, k}:
    report.json's `tasks` entries)."""
    task_about = task_about or {}
    clash = sorted(task_results.keys() & set_scores.keys())
    if clash:
        raise ValueError(f"{clash[0]} names both a task and a held-out set: rename the task")
    results, configs, versions, shots, better, samples = {}, {}, {}, {}, {}, {}
    for name, by_metric in task_results.items():
        about = task_about.get(name, {})
        # A sib200 task prompts with k examples; the other layouts are scored zero-shot.
        shots[name] = about.get("k", 0) if about.get("layout") == "sib200" else 0
        results[name] = _task_results(name, by_metric)
        configs[name] = _task_config(name, about, list(by_metric), shots[name])
        versions[name] = HARNESS_VERSIONS.get(about.get("layout"))
        better[name] = {metric: True for metric in by_metric}
        n = results[name]["sample_len"]
        samples[name] = {"original": n, "effective": n}
    for name, score in set_scores.items():
        results[name], configs[name] = _set_results(name, score), _set_config(name, score)
        versions[name], shots[name] = None, 0
        better[name] = {metric: False for metric, _ in BITS_PER_BYTE_METRICS}
        samples[name] = {"original": score["documents"], "effective": score["documents"]}
    return {
        "results": results,
        "group_subtasks": {},
        "configs": dict(sorted(configs.items())),
        "versions": dict(sorted(versions.items())),
        "n-shot": dict(sorted(shots.items())),
        "higher_is_better": dict(sorted(better.items())),
        "n-samples": samples,
        "config": {"model": "hf", "model_args": f"pretrained={model_folder}"},
        "date": time.time() if date is None else date,
        "model_source": "hf",
        "model_name": model_folder,
    }


def models_in_report(report: dict) -> dict[str, dict]:
    """Each model's part of the evaluate stage's report (report.json): its folder, its task results,
    what each task is, and its held-out sets' scores with where their text is."""
    tasks = report.get("tasks", {})
    return {
        model: {
            "folder": folder,
            "tasks": {name: about["results"][model] for name, about in tasks.items()},
            "task_about": tasks,
            "sets": {
                name: {**score, "text": report["sets"].get(name, {}).get("text")}
                for name, score in report["scores"].get(model, {}).items()
            },
        }
        for model, folder in report["models"].items()
    }


def write_lm_eval_results(folder: Path, model_results: dict[str, dict]) -> list[Path]:
    """`results_<model>.json` for each model (models_in_report's entries, in order) and
    `results.json` for the last one (the trained model, where there is one) in `folder`."""
    written, date, results = [], time.time(), None
    for model, about in model_results.items():
        results = lm_eval_results(
            about["folder"], about["tasks"], about["sets"], about.get("task_about"), date
        )
        written.append(Path(folder) / f"results_{model}.json")
        write_json_atomic(written[-1], results)
    if results is not None:
        written.append(Path(folder) / RESULTS_FILE)
        write_json_atomic(written[-1], results)
    return written
