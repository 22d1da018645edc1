"""Stage `warmup`: the base model with the new tokenizer, only the embeddings (and LM head) trained.

The launching process loads the base model (`model.base`), checks that it fits the configured model,
builds the new embedding rows (`warmup.init`: `mean` or `random`, pipeline/warmstart/transfer.py) and
writes the initial model; `parallel.pp x parallel.dp` ranks then train it on DeepSpeed's pipeline
engine with ZeRO-1, the whole transformer body frozen, reading the pack stage's sampler; held-out bits
per byte are scored before and after. Outputs: `checkpoint/` (the pipeline checkpoint that
`stage=pretrain` starts from), `hf/` (a transformers folder with the new tokenizer), `metrics.jsonl`,
`report.json` and the marker.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from pipeline.contract import Stage, StageRun, write_json_atomic
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError
from pipeline.model.files import check_fit, folder_fingerprint, load_base, save_checkpoint
from pipeline.tokenization.folder import load_tokenizer
from pipeline.training.job import TrainingJob
from pipeline.training.outputs import INIT, METRICS_FILE
from pipeline.training.run import export_trained, launch, write_heldout
from pipeline.warmstart.initialise import warm_started

log = logging.getLogger(__name__)


def describe_inputs(cfg) -> dict:
    """The base model's files: a different base reruns the warm start."""
    return {} if cfg.model.base is None else {"base_model": folder_fingerprint(cfg.model.base)}


def trainable(cfg) -> list[str]:
    """Only the input embeddings, the LM head (when untied) and, if asked, the embedding LayerNorm."""
    return ["embedding.tokens.", "head."] + (["embedding.norm."] if cfg.warmup.train_embedding_norm else [])


def training_job(run: StageRun) -> TrainingJob:
    cfg = run.cfg
    return TrainingJob(stage="warmup", folder=str(run.work_dir), pack=str(run.input("pack")),
                       seq_len=cfg.warmup.train.seq_len or cfg.model.max_seq_len, train=cfg.warmup.train,
                       parallel=cfg.parallel, kernels=cfg.kernels, trainable=trainable(cfg))


def run_warmup(run: StageRun) -> dict:
    cfg = run.cfg
    if cfg.model.base is None:
        raise StageError("warmup needs a base model: set model.base=<local Hugging Face folder or pipeline "
                         "checkpoint> (with its tokenizer.json), e.g. model.base=/models/bloom-560m")
    base = load_base(cfg.model.base)
    base_tokenizer = load_tokenizer(cfg.model.base)
    check_fit(cfg.model, base.cfg, cfg.model.base, base_tokenizer)
    tokenizer_dir = run.input("tokenizer")
    new_tokenizer = load_tokenizer(tokenizer_dir)
    model, transfer = warm_started(base, Path(cfg.model.base), base_tokenizer, tokenizer_dir, new_tokenizer,
                                   cfg.warmup.init, cfg.warmup.train.seed)
    log.info("warmup %s: %s initialisation of %d rows: %s", run.lang, cfg.warmup.init, model.cfg.vocab_size,
             transfer["embedding"])
    save_checkpoint(model, run.work_dir / INIT)
    job = training_job(run)
    heldout = clean_output(run.lang, run.input("clean"), split="heldout")
    texts = (document.text for document in read_documents(heldout, run.work_dir / "scratch"))
    scored = write_heldout(job, texts, new_tokenizer, new_tokenizer.token_to_id(cfg.tokenizer.special_tokens.eos))
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    (run.work_dir / METRICS_FILE).unlink(missing_ok=True)
    result = launch(job, cfg.cluster)
    trained = export_trained(run.work_dir, tokenizer_dir)
    trained_tensors = _check_body_unchanged(base, trained, job.trains)
    shutil.rmtree(run.work_dir / INIT)
    trained_parameters = sum(t.numel() for name, t in trained.named_parameters() if name in trained_tensors)
    report = {"base": str(Path(cfg.model.base).resolve()), "init": cfg.warmup.init, "rows": transfer,
              "trained_tensors": trained_tensors, "trained_parameters": trained_parameters, "heldout_scored": scored,
              **result}
    write_json_atomic(run.work_dir / "report.json", report)
    log.info("warmup %s: held-out bits per byte %.4f after %s initialisation, %.4f after %d steps (on %s held-out "
             "tokens, warmup.train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)",
             run.lang, result["heldout_bpb_before"], cfg.warmup.init, result["heldout_bpb_after"], result["steps"],
             f"{scored['tokens']:,}")
    return {key: value for key, value in report.items() if key != "sampler"}


def _check_body_unchanged(base, trained, is_trainable) -> list[str]:
    """Fail if training moved any frozen tensor; returns the names of the trained ones."""
    base_state = base.state_dict()
    moved = []
    for name, tensor in trained.state_dict().items():
        if is_trainable(name):
            continue
        if name not in base_state or not torch.equal(tensor.to(base_state[name].dtype), base_state[name]):
            moved.append(name)
    if moved:
        raise StageError(f"warmup: frozen tensors changed during training: {moved[:5]}. This is a bug; please report it.")
    return sorted(name for name in trained.state_dict() if is_trainable(name))


STAGE = Stage(
    name="warmup",
    run=run_warmup,
    needs=("clean", "tokenizer", "pack"),
    config_sections=("model", "warmup"),
    describe_inputs=describe_inputs,
    gpu=True,
)
