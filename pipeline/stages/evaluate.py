"""Stage `evaluate`: bits per byte of the base, warm-started and final models on held-out text of the language.

Each model is scored with its own tokenizer (pipeline/evaluation/bits_per_byte.py), so the numbers are
comparable although the base model's tokenizer is not the language's. The models: the base model
(`model.base`, or the one the warmup stage started from), `work/<lang>/warmup/hf` and
`work/<lang>/pretrain/hf`, each when it exists. The text: the clean stage's held-out split, or `eval.path`.
Outputs: `report.json`, `report.md`, `bpb.png` and `training_curves.png` (loss and held-out BPB of warmup
and pretrain against training tokens).
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.contract import MARKER, Stage, StageRun, read_marker, resolve_path, stage_dir, write_json_atomic
from pipeline.corpus.reader import fingerprint_files
from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import score_documents
from pipeline.evaluation.report import markdown, write_plots
from pipeline.evaluation.texts import describe_text, eval_texts, text_files
from pipeline.kernels import set_backend
from pipeline.model.files import base_identity, check_finite, load_base
from pipeline.tokenization.folder import load_tokenizer, token_roles
from pipeline.training.outputs import EXPORT, METRICS_FILE

log = logging.getLogger(__name__)

TRAINED = ("warmup", "pretrain")


def base_model(cfg) -> str | None:
    """`model.base`, else the base the warmup stage recorded in its marker (in this work folder, wherever it is)."""
    if cfg.model.base is not None:
        return cfg.model.base
    marker = read_marker(stage_dir(cfg, "warmup"))
    return str(resolve_path(cfg.work_dir, marker["metrics"]["base"])) if marker is not None else None


def needs_when(cfg) -> tuple[str, ...]:
    """The clean stage's held-out split is the text unless eval.path gives one. Without any model to score, the
    text does not matter: that is said first."""
    if base_model(cfg) is None and not any(read_marker(stage_dir(cfg, stage)) is not None for stage in TRAINED):
        raise StageError(f"evaluate {cfg.lang.code}: there is no model to evaluate: no model.base, and neither "
                         f"{stage_dir(cfg, 'warmup') / MARKER} nor {stage_dir(cfg, 'pretrain') / MARKER} exists. "
                         f"Give model.base=<Hugging Face folder> or run the training stages first.")
    return ("clean",) if cfg.eval.path is None else ()


def describe_inputs(cfg) -> dict:
    """The base model's files and `eval.path`'s files (the trained models and clean come through the contract)."""
    inputs = {}
    base = base_model(cfg)
    if base is not None:
        inputs["base"] = base_identity(cfg, base)
    if cfg.eval.path is not None:
        folder, files, _ = text_files(Path(cfg.eval.path))
        inputs["text"] = fingerprint_files(folder, files)
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


def score_model(run: StageRun, name: str, folder: str, device) -> dict:
    cfg = run.cfg
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
    seq_len = min(cfg.eval.seq_len or model.cfg.max_seq_len, model.cfg.max_seq_len)
    stride = min(cfg.eval.stride or max(1, seq_len // 2), seq_len)
    clean = run.input("clean") if run.has_input("clean") else None
    texts = eval_texts(cfg.eval.path, run.lang, clean, run.work_dir / "scratch", cfg.eval.max_bytes)
    with tqdm(desc=f"evaluate {name}", unit="tok", disable=None) as progress:
        score = score_documents(model, tokenizer, texts, start_id, seq_len, stride, cfg.eval.batch_size, device,
                                progress)
    if score.documents == 0:
        raise StageError(f"evaluate {run.lang}: {describe_text(cfg.eval.path, clean)} holds no text. Give "
                         f"eval.path=<file or folder>, or raise clean.heldout_min_documents and run clean again.")
    if not math.isfinite(score.bits_per_byte):
        raise StageError(f"evaluate {run.lang}: the {name} model in {folder} scores {score.bits_per_byte} bits per "
                         f"byte on {describe_text(cfg.eval.path, clean)}: its outputs overflow. No report is "
                         f"written; check the model (and eval.seq_len against the length it was trained on).")
    result = {**score.as_dict(), "seq_len": seq_len, "stride": stride}
    log.info("evaluate %s: %s %.4f bits per byte (token perplexity %.2f, %d tokens over %d bytes)", run.lang, name,
             score.bits_per_byte, score.token_perplexity, score.tokens, score.bytes)
    return result


def run_evaluate(run: StageRun) -> dict:
    cfg = run.cfg
    set_backend(cfg.kernels)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = models(run)
    scores = {name: score_model(run, name, folder, device) for name, folder in found.items()}
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    curves = {stage: run.input(stage) / METRICS_FILE for stage in TRAINED
              if stage in found and (run.input(stage) / METRICS_FILE).is_file()}
    plots = write_plots(run.work_dir, scores, curves)
    text = describe_text(cfg.eval.path, run.input("clean") if run.has_input("clean") else None)
    report = {"lang": run.lang, "text": text, "models": found, "scores": scores}
    write_json_atomic(run.work_dir / "report.json", report)
    (run.work_dir / "report.md").write_text(markdown(run.lang, text, scores, found, plots), encoding="utf-8")
    log.info("evaluate %s: report in %s", run.lang, run.final_dir / "report.md")
    return {name: {"bits_per_byte": s["bits_per_byte"], "token_perplexity": s["token_perplexity"]}
            for name, s in scores.items()}


STAGE = Stage(
    name="evaluate",
    run=run_evaluate,
    needs_when=needs_when,
    reads_if_done=TRAINED,
    hint="Or give eval.path=<file or folder of held-out text> instead of the clean stage's held-out split.",
    config_sections=("eval",),
    # eval.path's files enter the hash by their content (describe_inputs), not by where they are.
    unhashed_keys=("eval.batch_size", "eval.path"),
    describe_inputs=describe_inputs,
)
