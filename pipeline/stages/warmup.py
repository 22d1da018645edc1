"""Stage `warmup`: the base model with the new tokenizer, only the embeddings (and LM head) trained.

The launching process reads the base model (`model.base`), checks that it fits the configured model,
builds the new embedding rows (`warmup.init`, pipeline/warmstart/transfer.py; `focus` and `align` learn
from the clean stage's training text) and writes the initial model a tensor at a time (it never holds the base's
body); `parallel.tp x parallel.pp x parallel.dp` ranks
then train it on DeepSpeed's pipeline engine with ZeRO-1, the transformer body frozen
(`warmup_trainable`, pipeline/warmstart/initialise.py), reading the pack stage's sampler; held-out bits per byte are scored
before and after. Outputs: `checkpoint/` (the pipeline checkpoint that
`stage=pretrain` starts from), `hf/` (a transformers folder with the new tokenizer), `metrics.jsonl`,
`report.json` and the marker.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import REPLAY_TARGET, PipelineConfig
from pipeline.contract import ON_RANKS, Stage, StageRun
from pipeline.errors import StageError
from pipeline.memory_fit import fitting_micro_batch
from pipeline.model.files import base_model_input
from pipeline.stages.training_inputs import model_as_trained, prepare_training
from pipeline.training.job import WHILE_TRAINING
from pipeline.training.run import SCRATCH, train_stage
from pipeline.warmstart.initialise import warm_start, warmup_trainable
from pipeline.work_folder import portable_path

log = logging.getLogger(__name__)


def run_warmup(run: StageRun) -> dict:
    cfg: PipelineConfig = run.cfg
    if cfg.model.base is None:
        raise StageError("warmup needs a base model: set model.base=<local Hugging Face folder or pipeline "
                         "checkpoint> (with its tokenizer.json), e.g. model.base=/models/bloom-560m")
    # A budget beyond the plan is refused before any work.
    # The pretrain planner's micro-batch: an upper bound of warmup's memory, whose frozen body has no gradients and
    # no optimizer state.
    train = fitting_micro_batch(cfg, cfg.warmup.train, prefix="warmup.train", model=model_as_trained(run))
    training = prepare_training(run, train, prefix="warmup.train", share=cfg.warmup.plan_share,
                                trainable=warmup_trainable(cfg.warmup.train_head, cfg.warmup.train_embedding_norm))
    start, transfer = warm_start(cfg.model, cfg.warmup, training.tokenizer_dir, training.tokenizer,
                                 run.input("clean"), run.lang, run.work_dir / SCRATCH / "transfer")
    step = (cfg.warmup.base_rows_lr or train.lr) / train.lr
    # Without rows that keep a base id at their place (a new tokenizer may have none), nothing to treat apart.
    if transfer["base_rows"] and (cfg.warmup.base_rows != "trained" or step != 1.0):
        sources = training.packed["sources"]
        learn_from = base_rows_sources(cfg.warmup.base_rows, run.lang, sources)
        training.job.gated_rows = transfer["base_rows"]
        # Rows that learn from every sequence need no gate, only their own step size.
        training.job.gated_rows_learn_from = None if len(learn_from) == len(sources) else learn_from
        training.job.gated_rows_step = step if learn_from else 1.0
        log.info("warmup %s: the first %d rows are the base's own and %s (warmup.base_rows=%s)", run.lang,
                 transfer["base_rows"], f"learn from {', '.join(learn_from)} at lr {step * train.lr:g}"
                 if learn_from else "stay as they are", cfg.warmup.base_rows)
    # Where the base is, relative to the work folder when inside it: stage=evaluate scores it too.
    report = train_stage(training, start, cfg.cluster, cfg.export,
                         about={"base": portable_path(cfg, cfg.model.base), "init": cfg.warmup.init, "rows": transfer})
    log.info("warmup %s: held-out bits per byte %.4f after %s initialisation, %.4f after %d steps (on %s held-out "
             "tokens, warmup.train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)",
             run.lang, report["heldout_bpb_before"], cfg.warmup.init, report["heldout_bpb_after"], report["steps"],
             f"{report['heldout_scored']['tokens']:,}")
    return report


def base_rows_sources(base_rows: str, lang: str, sources: list[dict]) -> list[str]:
    """The pack's sources (packed.json's entries) whose sequences train the base's rows: every one with `trained`;
    with `replayed`, every one but the language's and the base's own samples (stage=replay's output), which top-p
    sampling makes sharper than text: trained by them, the rows lose the base's language (docs/benchmark-log.md, "The warm
    start's base rows trained by the replayed English"); with `frozen`, none."""
    if base_rows == "trained":
        return [source["name"] for source in sources]
    if base_rows == "replayed":
        return [source["name"] for source in sources
                if source["name"] != lang and Path(source["path"]).name != REPLAY_TARGET]
    return []


STAGE = Stage(
    name="warmup",
    run=run_warmup,
    needs=("clean", "tokenizer", "pack"),
    config_sections=("model", "warmup"),
    # The base model enters the hash by its content (base_model_input), not by where it is; the micro-batch only
    # cuts the global batch.
    unhashed_keys=("model.base", "warmup.train.micro_batch_size"),
    describe_inputs=base_model_input,
    placement=lambda cfg: ON_RANKS,
    scratch=WHILE_TRAINING,
)
