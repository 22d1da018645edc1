"""The stages, in the order the recipe runs them. Each module exposes `STAGE` (a contract.Stage)."""

from __future__ import annotations

import logging

from pipeline.contract import Stage, execute
from pipeline.stages import clean, mix, pack, pretrain, tokenizer, warmup

log = logging.getLogger(__name__)

STAGES: dict[str, Stage] = {stage.name: stage for stage in (clean.STAGE, mix.STAGE, tokenizer.STAGE, pack.STAGE,
                                                             warmup.STAGE, pretrain.STAGE)}
STAGE_NAMES: tuple[str, ...] = tuple(STAGES)
# What `stage=` accepts: one stage, or `all` for the whole chain in order.
TARGETS: tuple[str, ...] = (*STAGE_NAMES, "all")


def run_target(cfg) -> None:
    names = STAGE_NAMES if cfg.stage == "all" else (cfg.stage,)
    for name in names:
        if cfg.stage == "all" and name == "warmup" and cfg.model.base is None:
            log.info("stage=all stops before warmup: it needs a base model (model.base=<local Hugging Face folder>, "
                     "with the matching preset, e.g. model=bloom-560m).")
            return
        later = STAGE_NAMES[STAGE_NAMES.index(name) + 1:]
        marker = execute(STAGES[name], cfg, downstream=later)
        if marker is None:
            log.info("Stage %s for %s was submitted; run the command again when it has finished to go on.",
                     name, cfg.lang.code)
            return
