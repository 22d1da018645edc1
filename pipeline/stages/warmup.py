"""Stage `warmup`: the base model with the new tokenizer, only the embeddings (and LM head) trained.

The launching process reads the base model (`model.base`), checks that it fits the configured model,
builds the new embedding rows (`warmup.init`, pipeline/warmstart/transfer.py; `focus` and `align` learn
from the clean stage's training text) and writes the initial model a tensor at a time (it never holds the base's
body); `parallel.tp x parallel.pp x parallel.dp` ranks
then train it on DeepSpeed's pipeline engine with ZeRO-1, the transformer body frozen
(pipeline/warmstart/freezing.py), reading the pack stage's sampler; held-out bits per byte are scored
before and after. Outputs: `checkpoint/` (the pipeline checkpoint that
`stage=pretrain` starts from), `hf/` (a transformers folder with the new tokenizer), `metrics.jsonl`,
`report.json` and the marker.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from pipeline.contract import Stage, StageRun, portable_path, read_json, write_json_atomic
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError
from pipeline.model.config import training_seq_len
from pipeline.model.export_config import shard_bytes
from pipeline.model.files import base_identity, base_tensors, check_fit, refuse_non_finite
from pipeline.model.model_tensors import CheckpointTensors, model_shapes, write_checkpoint
from pipeline.packing.packed import PACKED_FILE
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer, token_roles
from pipeline.training.config import planned, use_bf16
from pipeline.training.job import TrainingJob
from pipeline.training.outputs import INIT, METRICS_FILE, TRAINED
from pipeline.training.peak_memory import peak_memory, return_large_blocks_to_the_system
from pipeline.training.run import check_pack_tokenizer, export_trained, launch, write_heldout
from pipeline.warmstart.freezing import warmup_trainable
from pipeline.warmstart.initialise import warm_started
from pipeline.warmstart.transfer import needs_text
from pipeline.warmstart.transfer_text import read_transfer_text

log = logging.getLogger(__name__)


def describe_inputs(cfg) -> dict:
    """The base model, by content: a different base reruns the warm start, a moved one does not."""
    return {} if cfg.model.base is None else {"base_model": base_identity(cfg, cfg.model.base)}


def trainable(cfg, num_layers: int) -> list[str]:
    """The input embeddings and what warmup.train_head/train_norms/train_embedding_norm add."""
    return warmup_trainable(cfg.warmup.train_head, cfg.warmup.train_norms, cfg.warmup.train_embedding_norm,
                            num_layers)


def training_job(run: StageRun, num_layers: int, packed: dict) -> TrainingJob:
    """The ranks' job, its step budget within the mix plan (warmup.train.steps null: warmup.plan_share of it)."""
    cfg = run.cfg
    seq_len = training_seq_len(cfg.model, cfg.warmup.train.seq_len)
    pack = str(run.input("pack"))
    return TrainingJob(stage="warmup", folder=str(run.work_dir), pack=pack, seq_len=seq_len,
                       train=planned(cfg.warmup.train, seq_len, packed["pass_tokens"], pack, prefix="warmup.train",
                                     share=cfg.warmup.plan_share),
                       parallel=cfg.parallel, kernels=cfg.kernels, trainable=trainable(cfg, num_layers))


def run_warmup(run: StageRun) -> dict:
    cfg = run.cfg
    return_large_blocks_to_the_system()  # the model passes through a tensor at a time
    if cfg.model.base is None:
        raise StageError("warmup needs a base model: set model.base=<local Hugging Face folder or pipeline "
                         "checkpoint> (with its tokenizer.json), e.g. model.base=/models/bloom-560m")
    packed = run.read_input("pack", PACKED_FILE, read_json)
    base = base_tensors(cfg.model.base)
    base_tokenizer = load_tokenizer(cfg.model.base)
    check_fit(cfg.model, base.cfg, cfg.model.base, base_tokenizer)
    job = training_job(run, base.cfg.num_layers, packed)  # a budget beyond the plan is refused before any work
    tokenizer_dir = run.input("tokenizer")
    new_tokenizer = run.read_input("tokenizer", TOKENIZER_FILE, load_tokenizer)
    texts = (read_transfer_text(run.input("clean"), run.lang, cfg.warmup.transfer_bytes, run.work_dir / "scratch")
             if needs_text(cfg.warmup.init) else None)
    initial, transfer = warm_started(base, Path(cfg.model.base), base_tokenizer, tokenizer_dir, new_tokenizer,
                                     cfg.warmup.init, cfg.warmup.train.seed, texts=texts)
    log.info("warmup %s: %s initialisation of %d rows in %.1f s: %s", run.lang, cfg.warmup.init,
             initial.cfg.vocab_size, transfer["cost"]["seconds"], transfer["embedding"])
    # Written a tensor at a time: this process never holds the model.
    refuse_non_finite(write_checkpoint(initial, run.work_dir / INIT), f"warmup: the base model {cfg.model.base}",
                      "a warm start from it cannot train. Give a sound model.base.")
    check_pack_tokenizer(job, packed, run.input_file("tokenizer", TOKENIZER_FILE), new_tokenizer.get_vocab_size())
    heldout = clean_output(run.lang, run.input("clean"), split="heldout")
    texts = (document.text for document in read_documents(heldout, run.work_dir / "scratch"))
    scored = write_heldout(job, texts, new_tokenizer, token_roles(tokenizer_dir, new_tokenizer)["eos"])
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    (run.work_dir / METRICS_FILE).unlink(missing_ok=True)
    result = launch(job, cfg.cluster)
    export_trained(run.work_dir, tokenizer_dir, shard_bytes(cfg.export))
    held = torch.bfloat16 if use_bf16(job.train) else torch.float32
    trained_tensors, trained_parameters = _check_body_unchanged(run.work_dir / INIT, run.work_dir / TRAINED,
                                                                job.trains, held)
    shutil.rmtree(run.work_dir / INIT)
    # Where the base is, relative to the work folder when inside it: stage=evaluate scores it too.
    report = {"base": portable_path(cfg, cfg.model.base), "init": cfg.warmup.init, "rows": transfer,
              "trained_tensors": trained_tensors, "trained_parameters": trained_parameters, "heldout_scored": scored,
              **result,
              # this process: the starting model, the export (and the training, with one rank started here)
              "peak_memory_stage_process": peak_memory()}
    write_json_atomic(run.work_dir / "report.json", report)
    log.info("warmup %s: held-out bits per byte %.4f after %s initialisation, %.4f after %d steps (on %s held-out "
             "tokens, warmup.train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)",
             run.lang, result["heldout_bpb_before"], cfg.warmup.init, result["heldout_bpb_after"], result["steps"],
             f"{scored['tokens']:,}")
    return {key: value for key, value in report.items() if key != "sampler"}


def _check_body_unchanged(initial: Path, trained: Path, is_trainable, held: torch.dtype) -> tuple[list[str], int]:
    """Fail if training moved any frozen tensor of the checkpoint `trained` away from the warm-started one
    `initial` (whose body is the base's, and whose frozen head, with warmup.train_head=false, is the transferred
    one), as the engine held it (`held`: bf16 on a GPU, where a frozen float32 tensor is rounded once and never
    updated); compared a tensor at a time. Returns the trained tensors' names and their number of values."""
    moved, trained_names, trained_values = [], [], 0
    with CheckpointTensors(initial) as before, CheckpointTensors(trained) as after:
        for name in model_shapes(after.cfg):
            tensor = after.read(name)
            if is_trainable(name):
                trained_names.append(name)
                trained_values += tensor.numel()
            elif not torch.equal(tensor, before.read(name).to(held).to(tensor.dtype)):
                moved.append(name)
    if moved:
        raise StageError(f"warmup: frozen tensors changed during training: {moved[:5]}. This is a bug; please report it.")
    return sorted(trained_names), trained_values


STAGE = Stage(
    name="warmup",
    run=run_warmup,
    needs=("clean", "tokenizer", "pack"),
    config_sections=("model", "warmup"),
    # The base model enters the hash by its content (describe_inputs), not by where it is.
    unhashed_keys=("model.base",),
    describe_inputs=describe_inputs,
    gpu=True,
)
