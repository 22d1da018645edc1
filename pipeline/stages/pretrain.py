"""Stage `pretrain`: continued pretraining of the whole model, tensor x pipeline x data parallel on DeepSpeed.

The launching process builds the starting model (`init`: the warmup stage's checkpoint, a Hugging Face
folder `model.base` that uses the pack's tokenizer, or random weights) and the held-out windows; then
`parallel.tp x parallel.pp x parallel.dp` ranks train it with ZeRO-1 from the pack sampler
(pipeline/training/run.py, loop.py), checkpointing every `train.checkpoint_every` steps and on
SIGUSR1/SIGTERM. `resume=auto` continues from the newest complete checkpoint of an interrupted run with the
same configuration (also with another data-parallel degree); `resume=never` starts again. Outputs:
`checkpoint/` (pipeline checkpoint), `hf/` (transformers folder with the tokenizer), `metrics.jsonl`,
`tensorboard/`, `report.json` and the marker.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import torch

from pipeline.contract import Stage, StageError, StageRun, stage_dir, upstream_input, write_json_atomic
from pipeline.model.transformer import Transformer
from pipeline.planning import check_layout
from pipeline.tokenization.folder import TOKENIZER_FILE
from pipeline.training.run import CHECKPOINTS, METRICS_FILE, export_trained, launch, rank_training, write_heldout
from pipeline.warmstart.base import (check_fit, folder_fingerprint, load_base, load_base_tokenizer, load_checkpoint,
                                     save_checkpoint)

log = logging.getLogger(__name__)


def describe_inputs(cfg) -> dict:
    """Where the weights start: the warmup stage's output or the base model's files."""
    if cfg.init == "warmup":
        return {"warmup": upstream_input(cfg, "pretrain", "warmup", fix=(
            f"pretrain init=warmup starts from it. Run it first: python -m pipeline stage=warmup "
            f"lang={cfg.lang.code} model.base=<folder>, or choose init=hf (model.base) or init=scratch."))}
    if cfg.init == "hf":
        if cfg.model.base is None:
            raise StageError("pretrain init=hf needs model.base=<local Hugging Face folder> whose tokenizer is the "
                             "pack's (e.g. work/<lang>/warmup/hf).")
        return {"base_model": folder_fingerprint(cfg.model.base)}
    return {}


def seq_len(cfg) -> int:
    return cfg.train.seq_len or cfg.model.max_seq_len


def initial_model(run: StageRun, tokenizer) -> Transformer:
    cfg = run.cfg
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if cfg.init == "scratch":
        torch.manual_seed(cfg.train.seed)
        return Transformer(dataclasses.replace(cfg.model, vocab_size=vocab))
    if cfg.init == "warmup":
        source = stage_dir(cfg, "warmup") / "checkpoint"
        model = load_checkpoint(source)
    else:
        source = Path(cfg.model.base)
        model = load_base(cfg.model.base)
        if load_base_tokenizer(cfg.model.base).get_vocab() != tokenizer.get_vocab():
            raise StageError(f"pretrain init=hf: the tokenizer of {source} is not the one the data was packed with "
                             f"({run.input_dirs['tokenizer'] / TOKENIZER_FILE}). Continue from a model that uses "
                             f"it (the warmup stage's output: init=warmup, or its hf/ folder), or warm-start "
                             f"this base model first: python -m pipeline stage=warmup lang={run.lang} "
                             f"model.base={source}")
    check_fit(cfg.model, model.cfg, str(source), tokenizer)
    if model.cfg.vocab_size != vocab:
        raise StageError(f"pretrain: the model of {source} has {model.cfg.vocab_size} vocabulary rows, the pack's "
                         f"tokenizer {vocab}; they must be the same (run warmup for this tokenizer).")
    return model


def run(run: StageRun) -> dict:
    from tokenizers import Tokenizer

    from pipeline.training import checkpoint  # imports DeepSpeed: only when the stage runs

    cfg = run.cfg
    check_layout(cfg)  # a layout that cannot fit the device is refused before any work, with one that fits
    tokenizer_dir = run.input_dirs["tokenizer"]
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / TOKENIZER_FILE))
    checkpoints = run.work_dir / CHECKPOINTS
    if cfg.resume == "never":
        shutil.rmtree(checkpoints, ignore_errors=True)
    resuming = checkpoint.latest(checkpoints) is not None
    if not resuming:
        (run.work_dir / METRICS_FILE).unlink(missing_ok=True)
        shutil.rmtree(run.work_dir / "tensorboard", ignore_errors=True)
    save_checkpoint(initial_model(run, tokenizer), run.work_dir / "init")
    eos_id = tokenizer.token_to_id(cfg.tokenizer.special_tokens.eos)
    write_heldout(run, cfg.train, cfg.parallel, seq_len(cfg), tokenizer, eos_id, key="train")
    result = launch("pipeline.stages.pretrain:train_rank", run)
    export_trained(run, tokenizer_dir)
    # The run is complete: the final model is in checkpoint/ and hf/; the resumable states are not needed.
    shutil.rmtree(checkpoints, ignore_errors=True)
    shutil.rmtree(run.work_dir / "init")
    report = {"init": cfg.init, "parallel": dataclasses.asdict(cfg.parallel), **result}
    write_json_atomic(run.work_dir / "report.json", report)
    log.info("pretrain %s: held-out bits per byte %.4f -> %.4f after %d steps (%s tokens)", run.lang,
             result["heldout_bpb_before"], result["heldout_bpb_after"], result["steps"], f"{result['tokens']:,}")
    return report


def train_rank(cfg, work_dir: Path) -> None:
    """One rank's part: train every parameter, resuming from the newest checkpoint when there is one."""
    rank_training(cfg, work_dir, cfg.train, seq_len(cfg), lambda name: True, resume=cfg.resume)


STAGE = Stage(name="pretrain", run=run, needs=("clean", "tokenizer", "pack"), config_sections=("model", "train", "init"),
              # How often to log, score and checkpoint, and how much to recompute, do not change the model: a
              # run interrupted with one setting resumes with another.
              unhashed_keys=("train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
                             "train.max_bad_steps", "train.activation_checkpoint_interval"),
              describe_inputs=describe_inputs, gpu=True)
