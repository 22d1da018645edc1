"""Stage `evaluate`: bits per byte of the base, warm-started and final models on held-out text, per held-out set.

Each model is scored with its own tokenizer (pipeline/evaluation/bits_per_byte.py), so the numbers are
comparable although the base model's tokenizer is not the language's. The models: the base model
(`model.base`, or the one the warmup stage recorded in its marker), `work/<lang>/warmup/hf` and
`work/<lang>/pretrain/hf`, each when it exists. The sets (pipeline/evaluation/texts.py): the clean stage's held-out
split (or `eval.path`), the sources the clean stage held out whole, and held-out text of the base model's language;
a trained model worse than the base on any of them is flagged. Then the downstream tasks of `eval.tasks` and the two
built from the held-out split (`eval.heldout_tasks`), all read and checked before any model loads. Outputs:
`report.json`, `report.md`, `bpb.png`, `training_curves.png` (loss and held-out BPB of warmup and pretrain against
training tokens) and the built tasks' files in `tasks/`.
"""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.config import PipelineConfig
from pipeline.contract import ON_CPU, ON_ONE_GPU, Stage, StageRun
from pipeline.corpus.reader import fingerprint_files
from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import Score, bits_per_byte, score_documents, score_rows
from pipeline.evaluation.config import task_name
from pipeline.evaluation.report import (added_tokens_line, find_regressions, markdown, regression_line,
                                       reproduction_line, write_plots)
from pipeline.evaluation.task_builder import build_heldout_tasks
from pipeline.evaluation.task_files import Task, read_task
from pipeline.evaluation.task_scoring import ScoringModel, score_task
from pipeline.evaluation.texts import (HELDOUT, TextSet, base_lang_sets, heldout_set, is_base_lang, text_files,
                                      text_sets)
from pipeline.json_files import write_json_atomic
from pipeline.kernels import set_backend
from pipeline.model.config import parameter_count, training_seq_len
from pipeline.model.files import base_identity, check_finite, load_base
from pipeline.model.transformer import Transformer
from pipeline.tokenization.folder import load_tokenizer, token_roles
from pipeline.training.heldout import load_rows
from pipeline.training.job import EXPORT, HELDOUT_FILE, METRICS_FILE
from pipeline.work_folder import MARKER, read_marker, resolve_path, stage_dir

log = logging.getLogger(__name__)

TRAINED = ("warmup", "pretrain")
# stage=workflow scores models of this size or more on a GPU (a real base: SmolLM2-135M took 2.2 minutes on one H100);
# the demo's small model on a CPU.
GPU_SCORING_PARAMETERS = 50_000_000
# The exported model rescoring its training stage's own held-out rows may differ from the number the stage logged by
# rounding only (bf16 on a GPU, other batches): more than this share is a disagreement between the two computations.
REPRODUCTION_TOLERANCE = 0.02


def base_model(cfg: PipelineConfig) -> str | None:
    """`model.base`, else the base the warmup stage recorded in its marker (in this work folder, wherever it is)."""
    if cfg.model.base is not None:
        return cfg.model.base
    marker = read_marker(stage_dir(cfg, "warmup"))
    return str(resolve_path(cfg.work_dir, marker["metrics"]["base"])) if marker is not None else None


def needs_when(cfg: PipelineConfig) -> tuple[str, ...]:
    """The clean stage's held-out split is the text unless eval.path gives one. Without any model to score, the
    text does not matter: that is said first."""
    if base_model(cfg) is None and not any(read_marker(stage_dir(cfg, stage)) is not None for stage in TRAINED):
        raise StageError(f"evaluate {cfg.lang.code}: there is no model to evaluate: no model.base, and neither "
                         f"{stage_dir(cfg, 'warmup') / MARKER} nor {stage_dir(cfg, 'pretrain') / MARKER} exists. "
                         f"Give model.base=<Hugging Face folder> or run the training stages first.")
    return ("clean",) if cfg.eval.path is None else ()


def describe_inputs(cfg: PipelineConfig) -> dict:
    """The base model's files, `eval.path`'s files and the text of the base model's language (the trained models
    and this language's clean output come through the contract)."""
    inputs = {}
    base = base_model(cfg)
    if base is not None:
        inputs["base"] = base_identity(cfg, base)
    if cfg.eval.path is not None:
        inputs["text"] = heldout_set(cfg.eval.path, cfg.lang.code, None).identity()
    base_lang = base_lang_sets(cfg)
    if not isinstance(base_lang, str):
        inputs["base_lang_text"] = {text_set.name: text_set.identity() for text_set in base_lang}
    if cfg.eval.tasks:
        inputs["tasks"] = {task_name(task): fingerprint_files(*text_files(Path(task.path))[:2])
                           for task in cfg.eval.tasks}
    return inputs


def models(run: StageRun) -> dict[str, str]:
    """Name -> model folder, in the recipe's order, for the models that exist."""
    found = {}
    base = base_model(run.cfg)
    if base is not None:
        found["base"] = base
    for stage in TRAINED:
        if run.has_input(stage):
            found[stage] = str(run.input(stage) / EXPORT)
    return found


@dataclass
class LoadedModel:
    """A model ready to score, with its own tokenizer and the windows that fit it."""

    name: str
    folder: str
    model: Transformer
    tokenizer: object
    start_id: int
    seq_len: int
    stride: int


def load_model(run: StageRun, name: str, folder: str, device: torch.device) -> LoadedModel:
    cfg: PipelineConfig = run.cfg
    model = load_base(folder)
    check_finite(model, f"evaluate {run.lang}: the {name} model in {folder}", "it is not scored. Train it again (or "
                 "give model.base a sound model).")
    model = model.to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    tokenizer = load_tokenizer(folder)
    start_id = token_roles(Path(folder), tokenizer)[cfg.eval.document_start]
    if start_id is None:
        raise StageError(f"evaluate: the tokenizer of {folder} has no {cfg.eval.document_start} token; set "
                         f"eval.document_start to the token its model saw before documents (eos or bos).")
    # null: the length the training stages train at by default, so that every model is scored as it trained
    seq_len = min(training_seq_len(model.cfg, cfg.eval.seq_len), model.cfg.max_seq_len)
    stride = min(cfg.eval.stride or max(1, seq_len // 2), seq_len)
    return LoadedModel(name, folder, model, tokenizer, start_id, seq_len, stride)


def score_set(run: StageRun, loaded: LoadedModel, text_set: TextSet, texts: list[str], device,
              first_added: int | None = None) -> Score:
    """The model's score on the set; with `first_added`, what its added tokens take there too (score_rows)."""
    with tqdm(desc=f"evaluate {loaded.name} on {text_set.name}", unit="tok", disable=None) as progress:
        score = score_documents(loaded.model, loaded.tokenizer, texts, loaded.start_id, loaded.seq_len,
                                loaded.stride, run.cfg.eval.batch_size, device, progress, first_added)
    if not math.isfinite(score.bits_per_byte):
        raise StageError(f"evaluate {run.lang}: the {loaded.name} model in {loaded.folder} scores "
                         f"{score.bits_per_byte} bits per byte on {text_set.where}: its outputs overflow. No report "
                         f"is written; check the model (and eval.seq_len against the length it was trained on).")
    log.info("evaluate %s: %s on %s: %.4f bits per byte (token perplexity %.2f, %d tokens over %d bytes)", run.lang,
             loaded.name, text_set.name, score.bits_per_byte, score.token_perplexity, score.tokens, score.bytes)
    if score.added is not None:
        log.info("evaluate %s: %s on %s: the added tokens take %.2f%% of the probability where a base token is the "
                 "target; %d of %d targets are added tokens", run.lang, loaded.name, text_set.name,
                 100 * score.added["mass"], score.added["added_targets"],
                 score.added["base_targets"] + score.added["added_targets"])
    return score


def first_added_id(base_vocab: dict[str, int] | None, tokenizer) -> int | None:
    """The first added id where `tokenizer` extends the base's (every base token at its own id, more after it, as
    tokenizer.extend_base makes it); None for another tokenizer or without a base."""
    if base_vocab is None:
        return None
    vocab = tokenizer.get_vocab()
    if len(vocab) <= len(base_vocab) or any(vocab.get(token) != token_id for token, token_id in base_vocab.items()):
        return None
    return max(base_vocab.values()) + 1


def reproduce_training_score(run: StageRun, loaded: LoadedModel, device) -> dict | None:
    """The training stage's own held-out rows (its heldout.npz: the same documents, windows and start token it
    scored) scored by the exported model the way evaluate scores: the stage's logged heldout_bpb_after again, unless
    something differs between the training engine and the exported model. None for the base, or an output without
    the rows."""
    if loaded.name not in TRAINED or not (run.input(loaded.name) / HELDOUT_FILE).is_file():
        return None
    logged = (read_marker(run.input(loaded.name)) or {}).get("metrics", {}).get("heldout_bpb_after")
    if logged is None:
        return None
    rows = run.read_input(loaded.name, HELDOUT_FILE, load_rows)
    nats, _ = score_rows(loaded.model, rows, run.cfg.eval.batch_size, device)
    rescored = bits_per_byte(nats, rows.bytes)
    result = {"logged": logged, "rescored": rescored, "seq_len": int(rows.inputs.shape[1]), "tokens": rows.tokens,
              "bytes": rows.bytes, "documents": rows.documents,
              "agree": abs(rescored - logged) <= REPRODUCTION_TOLERANCE * logged}
    if result["agree"]:
        log.info("evaluate %s: %s", run.lang, reproduction_line(loaded.name, result))
    else:
        log.warning("evaluate %s: %s", run.lang, reproduction_line(loaded.name, result))
    return result


def read_sets(run: StageRun) -> tuple[dict[str, TextSet], dict[str, list[tuple[str, dict]]], dict[str, str]]:
    """The held-out sets with text, their documents as (text, metadata), up to eval.max_bytes each, and why the others
    are skipped."""
    cfg: PipelineConfig = run.cfg
    clean = run.input("clean") if run.has_input("clean") else None
    found, skipped = text_sets(cfg, clean)
    sets, records = {}, {}
    for text_set in found:
        documents = [record for record in text_set.records(run.work_dir / "scratch", cfg.eval.max_bytes) if record[0]]
        if documents:
            sets[text_set.name], records[text_set.name] = text_set, documents
        elif text_set.name == HELDOUT:
            raise StageError(f"evaluate {run.lang}: {text_set.where} holds no text. Give eval.path=<file or folder>, "
                             f"or raise clean.heldout_min_documents and run clean again.")
        else:
            skipped[text_set.name] = f"{text_set.where} holds no text"
    for name, reason in skipped.items():
        log.info("evaluate %s: the `%s` set is not scored: %s.", run.lang, name, reason)
    return sets, records, skipped


def read_tasks(run: StageRun, heldout: list[tuple[str, dict]]) -> tuple[list[Task], dict[str, str]]:
    """eval.tasks and the tasks built from the `heldout` set's documents (eval.heldout_tasks), read and checked: a
    bad file fails here, before any model loads. Also why a built task is missing."""
    cfg: PipelineConfig = run.cfg
    configured, skipped = list(cfg.eval.tasks), {}
    if cfg.eval.heldout_tasks:
        built, skipped = build_heldout_tasks(heldout, run.lang, run.work_dir / "tasks")
        for task in built:
            if any(task_name(other) == task.name for other in cfg.eval.tasks):
                raise StageError(f"evaluate {run.lang}: eval.tasks names a task `{task.name}`, like the task built "
                                 f"from the held-out text; give it another name, or set eval.heldout_tasks=false.")
        configured += built
    for name, reason in skipped.items():
        log.info("evaluate %s: the `%s` task is not built from the held-out text: %s.", run.lang, name, reason)
    return [read_task(task, run.work_dir / "scratch" / "datasets") for task in configured], skipped


def score_tasks(run: StageRun, loaded: LoadedModel, tasks: list[Task], device) -> dict[str, dict]:
    scorer = ScoringModel(loaded.model, loaded.tokenizer, loaded.start_id, loaded.seq_len, run.cfg.eval.batch_size,
                          device)
    results = {}
    for task in tasks:
        accuracies = score_task(scorer, task)
        results[task.name] = {scoring: accuracy.as_dict() for scoring, accuracy in accuracies.items()}
        log.info("evaluate %s: %s on the %s task: %s", run.lang, loaded.name, task.name,
                 ", ".join(f"{scoring} {accuracy.accuracy:.3f} (n={accuracy.n}, chance {accuracy.chance:.3f})"
                           for scoring, accuracy in accuracies.items()))
    return results


def describe_task(run: StageRun, task: Task) -> dict:
    path = Path(task.path)
    if path.is_relative_to(run.work_dir):  # a task built here: where it will be once the stage is done
        path = run.final_dir / path.relative_to(run.work_dir)
    about = {"layout": task.layout, "language": task.language, "path": str(path)}
    if task.layout == "sib200":
        counts = [sum(example.label == label for example in task.test) for label in task.labels]
        return {**about, "labels": list(task.labels), "train": len(task.train), "dev": len(task.dev),
                "test": len(task.test), "k": task.k, "majority": max(counts) / len(task.test)}
    return {**about, "test": len(task.questions)}


def run_evaluate(run: StageRun) -> dict:
    cfg: PipelineConfig = run.cfg
    set_backend(cfg.kernels)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = models(run)
    sets, records, skipped = read_sets(run)
    tasks, skipped_tasks = read_tasks(run, records[HELDOUT])
    texts = {name: [text for text, _ in documents] for name, documents in records.items()}
    # What the added tokens take is measured on the first set of the base's language (the unread book for English).
    base_set = next((name for name in sets if is_base_lang(name)), None)
    scores, task_results, reproduced, added = {}, {}, {}, {}
    base_vocab = None  # the base comes first in `found`
    for name, folder in found.items():
        loaded = load_model(run, name, folder, device)
        if name == "base":
            base_vocab = loaded.tokenizer.get_vocab()
        first_added = None if name == "base" else first_added_id(base_vocab, loaded.tokenizer)
        scored = {set_name: score_set(run, loaded, text_set, texts[set_name], device,
                                      first_added if set_name == base_set else None)
                  for set_name, text_set in sets.items()}
        scores[name] = {set_name: {**score.as_dict(), "seq_len": loaded.seq_len, "stride": loaded.stride}
                        for set_name, score in scored.items()}
        if base_set is not None and scored[base_set].added is not None:
            added[name] = scored[base_set].added
        again = reproduce_training_score(run, loaded, device)
        if again is not None:
            reproduced[name] = again
        task_results[name] = score_tasks(run, loaded, tasks, device)
        del loaded  # one model in memory at a time
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    bpb = {name: {set_name: score["bits_per_byte"] for set_name, score in by_set.items()}
           for name, by_set in scores.items()}
    regressions = find_regressions(bpb)
    for regression in regressions:
        log.warning("evaluate %s: %s", run.lang, regression_line(regression, sets[regression["set"]].title))
    if added and any(is_base_lang(regression["set"]) for regression in regressions):
        log.warning("evaluate %s: %s", run.lang, added_tokens_line(added, sets[base_set].title))
    if "base" not in found:
        log.info("evaluate %s: no base model to compare with (model.base), so no regression is checked.", run.lang)
    curves = {stage: run.input(stage) / METRICS_FILE for stage in TRAINED
              if stage in found and (run.input(stage) / METRICS_FILE).is_file()}
    titles = {name: text_set.title for name, text_set in sets.items()}
    plots = write_plots(run.work_dir, bpb, titles, curves)
    described = {name: {"title": text_set.title, "text": text_set.where, "documents": len(texts[name]),
                        "bytes": sum(len(text.encode("utf-8")) for text in texts[name])}
                 for name, text_set in sets.items()}
    task_report = {task.name: {**describe_task(run, task), "results": {model: task_results[model][task.name]
                                                                  for model in found}} for task in tasks}
    report = {"lang": run.lang, "models": found, "sets": described, "skipped_sets": skipped, "scores": scores,
              "regressions": regressions, "added_tokens": {"set": base_set, "models": added} if added else {},
              "training_heldout": reproduced, "tasks": task_report,
              "skipped_tasks": skipped_tasks}
    write_json_atomic(run.work_dir / "report.json", report)
    (run.work_dir / "report.md").write_text(markdown(run.lang, report, plots), encoding="utf-8")
    log.info("evaluate %s: report in %s", run.lang, run.final_dir / "report.md")
    return {"bits_per_byte": bpb, "regressions": regressions,
            "training_heldout": {name: {key: again[key] for key in ("logged", "rescored", "agree")}
                                 for name, again in reproduced.items()},
            "tasks": {task: {model: {scoring: result["accuracy"] for scoring, result in by_model.items()}
                             for model, by_model in about["results"].items()} for task, about in task_report.items()}}


def placement(cfg: PipelineConfig) -> str:
    """One GPU for models large enough to need one (the model's shape is the base's, which the trained ones keep)."""
    return ON_ONE_GPU if parameter_count(cfg.model) >= GPU_SCORING_PARAMETERS else ON_CPU


STAGE = Stage(
    name="evaluate",
    run=run_evaluate,
    needs_when=needs_when,
    # clean's held-out sources are scored with eval.path too, when clean is done
    reads_if_done=("clean", *TRAINED),
    hint="Or give eval.path=<file or folder of held-out text> instead of the clean stage's held-out split.",
    config_sections=("eval",),
    # The files of eval.path, eval.base_lang_path and eval.tasks enter the hash by their content (describe_inputs), not
    # by where they are.
    unhashed_keys=("eval.batch_size", "eval.path", "eval.base_lang_path", "eval.tasks.*.path"),
    describe_inputs=describe_inputs,
    placement=placement,
)
