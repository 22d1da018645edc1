"""Stage `pretrain`: continued pretraining of the whole model, tensor x pipeline x data parallel on DeepSpeed.

The launching process writes the starting model a tensor at a time (`init`: the warmup stage's checkpoint, a
Hugging Face folder `model.base` that uses the pack's tokenizer, or random weights, each tensor drawn from its own
seed so that every layout starts from the same model) and the held-out rows; then
`parallel.tp x parallel.pp x parallel.dp` ranks train it with ZeRO-1 from the pack sampler
(pipeline/training/), checkpointing every `train.checkpoint_every` steps and on SIGUSR1/SIGTERM.
`resume=auto` continues an interrupted run from its newest checkpoint that verifies, with the same configuration
(also with another data-parallel degree, micro-batch size or how often it logs, scores and checkpoints) or with
another step budget `train.steps` (the schedule is computed for the new total from the checkpoint's step on); any
other change is refused while those checkpoints exist. `resume=never` moves them aside and starts again.
Outputs: `checkpoint/` (pipeline checkpoint), `hf/` (transformers folder with the tokenizer), `metrics.jsonl`,
`tensorboard/`, `report.json` and the marker.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.contract import ON_RANKS, Stage, StageRun
from pipeline.errors import StageError
from pipeline.memory_fit import check_layout, fitting_micro_batch
from pipeline.model.files import base_identity, base_tensors, check_fit
from pipeline.model.model_tensors import ScratchTensors, StartingModel, opened_checkpoint
from pipeline.stages.training_inputs import model_as_trained, prepare_training
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer
from pipeline.training.checkpoint_files import checkpoint_step, checkpoints
from pipeline.training.job import CHECKPOINTS, TRAINED, WHILE_TRAINING
from pipeline.training.run import kept_checkpoints, train_stage

log = logging.getLogger(__name__)


def needs_when(cfg: PipelineConfig) -> tuple[str, ...]:
    return ("warmup",) if cfg.init == "warmup" else ()


def pretrain_start(run: StageRun, tokenizer: Tokenizer) -> StartingModel:
    """Where continued pretraining starts (`init`): the warmup stage's checkpoint, `model.base` (which must use the
    pack's tokenizer), or random weights, each tensor drawn from its own seed so that every layout starts from the
    same model."""
    cfg = run.cfg
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if cfg.init == "scratch":
        tensors = ScratchTensors(dataclasses.replace(cfg.model, vocab_size=vocab), cfg.train.seed)
        source = f"a random initialisation with model.init_std={cfg.model.init_std}"
    elif cfg.init == "warmup":
        source = run.input("warmup") / TRAINED
        tensors = run.read_input("warmup", TRAINED, opened_checkpoint)
    else:
        source = Path(cfg.model.base)
        tensors = base_tensors(cfg.model.base)
        if load_tokenizer(cfg.model.base).get_vocab() != tokenizer.get_vocab():
            raise StageError(f"pretrain init=hf: the tokenizer of {source} is not the one the data was packed with "
                             f"({run.input('tokenizer') / TOKENIZER_FILE}). Continue from a model that uses "
                             f"it (the warmup stage's output: init=warmup, or its hf/ folder), or warm-start "
                             f"this base model first: python -m pipeline stage=warmup lang={run.lang} "
                             f"model.base={source}")
    check_fit(cfg.model, tensors.cfg, str(source), tokenizer)
    if tensors.cfg.vocab_size != vocab:
        raise StageError(f"pretrain: the model of {source} has {tensors.cfg.vocab_size} vocabulary rows, the pack's "
                         f"tokenizer {vocab}; they must be the same (run warmup for this tokenizer).")
    return StartingModel(tensors, f"pretrain: the starting model ({source})", "every training step would be "
                         "skipped. Start from a sound model: run the stage that made it again, or check model.init_std.")


def describe_start(cfg) -> dict:
    """Where pretraining's weights start when not from the warmup stage, for the stage contract: the base model's
    files (init=hf)."""
    if cfg.init == "hf":
        if cfg.model.base is None:
            raise StageError("pretrain init=hf needs model.base=<local Hugging Face folder> whose tokenizer is the "
                             "pack's (e.g. work/<lang>/warmup/hf).")
        return {"base_model": base_identity(cfg, cfg.model.base)}
    return {}


def check_resume(partial: Path, cfg) -> list[str]:
    """An interrupted run continues with another train.steps only if the budget lies at or past its newest
    checkpoint (fewer steps would end before where it already is)."""
    newest = max((checkpoint_step(path) for path in checkpoints(partial / CHECKPOINTS)), default=0)
    if cfg.train.steps is not None and cfg.train.steps < newest:
        return [f"its newest checkpoint is at step {newest}, past train.steps={cfg.train.steps}"]
    return []


def run_pretrain(run: StageRun) -> dict:
    cfg: PipelineConfig = run.cfg
    model = model_as_trained(run)
    train = fitting_micro_batch(cfg, cfg.train, model=model)
    # A layout that cannot fit the device is refused before any work, with one that fits.
    check_layout(cfg, train, model)
    # A budget beyond the plan is refused before the model is written.
    training = prepare_training(run, train, resume=cfg.resume)
    start = pretrain_start(run, training.tokenizer)
    report = train_stage(training, start, cfg.cluster, cfg.export,
                         about={"init": cfg.init, "parallel": dataclasses.asdict(cfg.parallel)})
    log.info("pretrain %s: held-out bits per byte %.4f -> %.4f after %d steps (%s tokens; scored on %s held-out "
             "tokens, train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)", run.lang,
             report["heldout_bpb_before"], report["heldout_bpb_after"], report["steps"], f"{report['tokens']:,}",
             f"{report['heldout_scored']['tokens']:,}")
    return report


STAGE = Stage(
    name="pretrain",
    run=run_pretrain,
    needs=("clean", "tokenizer", "pack"),
    needs_when=needs_when,
    hint="With init=warmup it starts from the warmup stage's model; init=hf (model.base) and init=scratch need "
         "no warmup.",
    config_sections=("model", "train", "init"),
    # How often to log, score and checkpoint, how much to recompute and how the global batch is cut into micro
    # batches do not change the model: a run interrupted with one setting resumes with another. model.base is
    # described by its content (describe_inputs) when init=hf reads it, and not read otherwise.
    unhashed_keys=("train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
                   "train.max_bad_steps", "train.max_skipped_fraction", "train.skipped_window",
                   "train.activation_checkpoint_interval", "train.micro_batch_size", "model.base"),
    # A larger step budget continues an interrupted run from its checkpoints (checkpoint.py: the schedule).
    resumable_keys=("train.steps",),
    check_resume=check_resume,
    kept_state=kept_checkpoints,
    describe_inputs=describe_start,
    placement=lambda cfg: ON_RANKS,
    scratch=WHILE_TRAINING,
)
