"""What `stage=` accepts, torch-free so that the command line checks it in a moment.

The recipe's stages in order (each a module of pipeline/stages/ under the stage contract), `all` for the
whole chain of one language, the Slurm targets of pipeline/workflow/, which take several languages, and `plan`
(pipeline/memory_fit/), which takes none.
"""

from __future__ import annotations

from pipeline.choices import closest_first
from pipeline.errors import ConfigError

STAGE_NAMES: tuple[str, ...] = ("clean", "mix", "tokenizer", "pack", "warmup", "pretrain", "evaluate")
# stage=workflow submits the chain to Slurm for one or many languages; stage=status shows how far it got.
WORKFLOW_TARGETS: tuple[str, ...] = ("workflow", "status")
# stage=plan prints whether the training layout fits the device (pipeline/memory_fit/); it needs no language.
PLAN_TARGET = "plan"
TARGETS: tuple[str, ...] = (*STAGE_NAMES, "all", *WORKFLOW_TARGETS, PLAN_TARGET)


def check_target(cfg) -> None:
    """`stage=` is a target; a stage (or `all`) runs for one language, the workflow targets for several."""
    if cfg.stage not in TARGETS:
        raise ConfigError("stage", cfg.stage, closest_first(cfg.stage, TARGETS))
    if cfg.stage not in (*WORKFLOW_TARGETS, PLAN_TARGET) and (cfg.lang is None or cfg.langs is not None):
        raise ConfigError("lang", cfg.langs, ["one ISO 639-3 code such as lang=nob (langs= is for stage=workflow "
                                              "and stage=status; sweep a stage with -m lang=nob,nno)"])
