"""The stages, in the order the recipe runs them. Each module exposes `STAGE` (a contract.Stage)."""

from __future__ import annotations

import dataclasses
import logging

from pipeline.contract import Stage, execute, stage_dir
from pipeline.demo_base import BASE_STAGES, demo_base_config, demo_base_folder
from pipeline.planning import print_plan
from pipeline.stages import clean, evaluate, mix, pack, pretrain, tokenizer, warmup

log = logging.getLogger(__name__)

STAGES: dict[str, Stage] = {stage.name: stage for stage in (clean.STAGE, mix.STAGE, tokenizer.STAGE, pack.STAGE,
                                                             warmup.STAGE, pretrain.STAGE, evaluate.STAGE)}
STAGE_NAMES: tuple[str, ...] = tuple(STAGES)
# stage=workflow submits the chain to Slurm for one or many languages; stage=status shows how far it got.
WORKFLOW_TARGETS: tuple[str, ...] = ("workflow", "status")
# stage=plan prints whether the training layout fits the device (pipeline/planning/); it needs no language.
PLAN_TARGET = "plan"
# What `stage=` accepts: one stage, `all` for the whole chain in order, a workflow target, or the plan.
TARGETS: tuple[str, ...] = (*STAGE_NAMES, "all", *WORKFLOW_TARGETS, PLAN_TARGET)


def run_target(cfg) -> None:
    if cfg.stage in WORKFLOW_TARGETS:
        from pipeline.workflow import run_workflow_target  # not contract stages: no marker of their own

        run_workflow_target(cfg)
    elif cfg.stage == PLAN_TARGET:
        print_plan(cfg)
    elif cfg.stage == "all":
        run_all(cfg)
    else:
        run_chain(cfg, (cfg.stage,))


def run_chain(cfg, names: tuple[str, ...]) -> bool:
    """Run `names` in order; False if one went to Slurm (the rest must wait for it)."""
    for name in names:
        later = STAGE_NAMES[STAGE_NAMES.index(name) + 1:]
        marker = execute(STAGES[name], cfg, downstream=later)
        if marker is None:
            log.info("Stage %s for %s was submitted; run the command again when it has finished to go on.",
                     name, cfg.lang.code)
            return False
    return True


def run_all(cfg) -> None:
    """The whole recipe for one language; without `model.base`, first the demo's own base model."""
    if cfg.model.base is None:
        base_cfg = demo_base_config(cfg)
        log.info("model.base is not set: using the demo's base model, pretrained from scratch on the embedded %s "
                 "text in %s (made once, then reused). Give model.base=<Hugging Face folder> (and the matching "
                 "model= preset) to start from a real one.", base_cfg.lang.name, demo_base_folder(cfg))
        if not run_chain(base_cfg, BASE_STAGES) or cfg.lang.code == base_cfg.lang.code:
            return
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, base=str(demo_base_folder(cfg))))
    if run_chain(cfg, STAGE_NAMES):
        report = stage_dir(cfg, "evaluate") / "report.md"
        log.info("The whole recipe for %s is done.", cfg.lang.code)
        print(f"Report: {report}")
