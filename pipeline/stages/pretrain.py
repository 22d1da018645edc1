"""Stage `pretrain`: continued pretraining of the whole model, tensor x pipeline x data parallel on
DeepSpeed.

The launching process writes the starting model a tensor at a time (`init`: the warmup stage's
checkpoint, a Hugging Face folder `model.base` that uses the pack's tokenizer, or random weights,
each tensor drawn from its own seed so that every layout starts from the same model) and the
held-out rows; then `parallel.tp x parallel.pp x parallel.dp` ranks train it with ZeRO-1 from the
pack sampler (pipeline/training/), checkpointing every `train.checkpoint_every` steps and on
SIGUSR1/SIGTERM. `resume=auto` continues an interrupted run from its newest checkpoint that
verifies, with the same configuration (also in another layout `parallel.tp/pp/dp`, with another
micro-batch size or how often it logs, scores and checkpoints) or with another step budget `train.steps` (the schedule
is computed for the new total from the checkpoint's step on); any other change is refused while
those checkpoints exist. `resume=never` moves them aside and starts again. `init=continue:<run>`
starts from another run's final training state instead, on a schedule of its own
(pipeline/stages/pretrain_start.py). Outputs: `checkpoint/` (pipeline checkpoint), `hf/`
(transformers folder with the tokenizer), `final_state/` (the last step's training state, for a run
that continues this one; `train.keep_final_state`), `metrics.jsonl`, `tensorboard/`, `report.json`
and the marker.
"""

from __future__ import annotations

import dataclasses
import logging

from pipeline.contract import ON_RANKS, Stage, StageRun
from pipeline.model.files import pretrain_start
from pipeline.stages.pretrain_start import (
    continued_for,
    describe_start,
    resume_problems,
    trained_start,
)
from pipeline.stages.training_inputs import prepare_training
from pipeline.training.job import WHILE_TRAINING
from pipeline.training.run import kept_checkpoints, train_stage

log = logging.getLogger(__name__)


def run_pretrain(run: StageRun) -> dict:
    cfg = run.cfg
    continued = continued_for(run)
    # A layout that cannot fit the device, or a budget beyond the plan, is refused before the model
    # is written.
    training = prepare_training(
        run,
        "train",
        resume=cfg.resume,
        refuse_unfit_layout=True,
        continue_from=None if continued is None else continued.state,
        start_step=0 if continued is None else continued.step,
    )
    start = pretrain_start(
        cfg.init,
        cfg.model,
        cfg.train.seed,
        training.tokenizer,
        base=cfg.model.base,
        trained=trained_start(run, continued),
        packed_with=training.tokenizer_file,
        lang=run.lang,
    )
    about = {"init": cfg.init, "parallel": dataclasses.asdict(cfg.parallel)}
    if continued is not None:
        about["continued_from"] = continued.lineage
    report = train_stage(training, start, cfg.cluster, cfg.export, about=about)
    log.info(
        "pretrain %s: held-out bits per byte %.4f -> %.4f after %d steps (%s tokens; scored on %s "
        "held-out "
        "tokens, train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)",
        run.lang,
        report["heldout_bpb_before"],
        report["heldout_bpb_after"],
        report["steps"],
        f"{report['tokens']:,}",
        f"{report['heldout_scored']['tokens']:,}",
    )
    return report


STAGE = Stage(
    name="pretrain",
    run=run_pretrain,
    needs=("clean", "tokenizer", "pack"),
    needs_when=lambda cfg: ("warmup",) if cfg.init == "warmup" else (),
    hint="With init=warmup it starts from the warmup stage's model; init=hf (model.base) and "
    "init=scratch need "
    "no warmup.",
    config_sections=("model", "train", "init"),
    # How often to log, score and checkpoint, how much to recompute and how the global batch is cut
    # into micro batches do not change the model: a run interrupted with one setting resumes with
    # another. model.base is described by its content (describe_inputs) when init=hf reads it, and
    # not read otherwise.
    unhashed_keys=(
        "train.log_every",
        "train.eval_every",
        "train.eval_tasks",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.max_bad_steps",
        "train.max_skipped_fraction",
        "train.skipped_window",
        "train.activation_checkpoint_interval",
        "train.micro_batch_size",
        "train.keep_final_state",
        "model.base",
    ),
    # A larger step budget continues an interrupted run from its checkpoints (checkpoint.py: the
    # schedule).
    resumable_keys=("train.steps",),
    check_resume=resume_problems,
    kept_state=kept_checkpoints,
    describe_inputs=describe_start,
    placement=lambda cfg: ON_RANKS,
    scratch=WHILE_TRAINING,
)
