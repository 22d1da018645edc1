"""Stage `warmup`: the base model with the new tokenizer, only the embeddings (and LM head) trained.

The launching process reads the base model (`model.base`), checks that it fits the configured model,
builds the new embedding rows (`warmup.init`, pipeline/warmup/transfer.py) and writes the initial
model a tensor at a time (it never holds the base's body); `parallel.tp x parallel.pp x parallel.dp`
ranks then train it on DeepSpeed's pipeline engine with ZeRO-1, the transformer body frozen
(`warmup_trainable`, pipeline/warmup/initialise.py), reading the pack stage's sampler; held-out bits
per byte are scored before and after. Outputs: `checkpoint/` (the pipeline checkpoint that
`stage=pretrain` starts from), `hf/` (a transformers folder with the new tokenizer),
`metrics.jsonl`, `report.json` and the marker.
"""

from __future__ import annotations

import logging

from pipeline.contract import ON_RANKS, Stage, StageRun
from pipeline.errors import StageError
from pipeline.model.files import base_model_input
from pipeline.stages.training_inputs import prepare_training
from pipeline.training.job import WHILE_TRAINING
from pipeline.training.run import train_stage
from pipeline.warmup.initialise import warm_start, warmup_trainable
from pipeline.work_folder import portable_path

log = logging.getLogger(__name__)


def run_warmup(run: StageRun) -> dict:
    cfg = run.cfg
    if cfg.model.base is None:
        raise StageError(
            "warmup needs a base model: set model.base=<local Hugging Face folder or pipeline "
            "checkpoint> (with its tokenizer.json), e.g. model.base=/models/bloom-560m"
        )
    # A budget beyond the plan is refused before any work. The micro-batch is pretrain's planner's:
    # an upper bound of warmup's memory, whose frozen body has no gradients and no optimizer state.
    training = prepare_training(
        run,
        "warmup.train",
        share=cfg.warmup.plan_share,
        trainable=warmup_trainable(cfg.warmup.train_head, cfg.warmup.train_embedding_norm),
    )
    train = training.job.train
    start, transfer = warm_start(
        cfg.model, cfg.warmup, training.tokenizer_dir, training.tokenizer, run.lang
    )
    step = (
        0.0
        if cfg.warmup.base_rows == "frozen"
        else (cfg.warmup.base_rows_lr or train.lr) / train.lr
    )
    # Without rows that keep a base id at their place (a new tokenizer may have none), nothing to
    # treat apart.
    if transfer["base_rows"] and step != 1.0:
        training.job.leading_rows = transfer["base_rows"]
        training.job.leading_rows_step = step
        sources = ", ".join(source["name"] for source in training.packed["sources"])
        log.info(
            "warmup %s: the first %d rows are the base's own and %s (warmup.base_rows=%s)",
            run.lang,
            transfer["base_rows"],
            f"learn from {sources} at lr {step * train.lr:g}" if step else "stay as they are",
            cfg.warmup.base_rows,
        )
    # Where the base is, relative to the work folder when inside it: stage=evaluate scores it too.
    report = train_stage(
        training,
        start,
        cfg.cluster,
        cfg.export,
        about={
            "base": portable_path(cfg, cfg.model.base),
            "init": cfg.warmup.init,
            "rows": transfer,
        },
    )
    log.info(
        "warmup %s: held-out bits per byte %.4f after %s initialisation, %.4f after %d steps (on "
        "%s held-out "
        "tokens, warmup.train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same "
        "text)",
        run.lang,
        report["heldout_bpb_before"],
        cfg.warmup.init,
        report["heldout_bpb_after"],
        report["steps"],
        f"{report['heldout_scored']['tokens']:,}",
    )
    return report


STAGE = Stage(
    name="warmup",
    run=run_warmup,
    needs=("clean", "tokenizer", "pack"),
    config_sections=("model", "warmup"),
    # The base model enters the hash by its content (base_model_input), not by where it is; the
    # micro-batch only cuts the global batch.
    unhashed_keys=("model.base", "warmup.train.micro_batch_size"),
    describe_inputs=base_model_input,
    placement=lambda cfg: ON_RANKS,
    scratch=WHILE_TRAINING,
)
