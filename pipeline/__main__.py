"""`python -m pipeline stage=<stage> lang=<code> [overrides]`: the one entry point of every stage."""

from __future__ import annotations

import gc
import logging
import sys

import hydra
import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.config import (CONF_DIR, PLAN_TARGET, WORKFLOW_TARGETS, PipelineConfig, check_target, register_configs,
                             validate)
from pipeline.errors import ConfigError, StageError, StageInterrupted
from pipeline.languages import UnknownLanguageError
from pipeline.memory_fit import print_plan
from pipeline.overrides import OverrideError, preflight

log = logging.getLogger("pipeline")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    try:
        config: PipelineConfig = OmegaConf.to_object(cfg)
        validate(config)
        check_target(config)
        if config.stage in WORKFLOW_TARGETS:
            from pipeline.workflow import run_workflow_target  # imports every stage, hence torch: not for --help

            run_workflow_target(config)
        elif config.stage == PLAN_TARGET:
            print_plan(config)
        else:
            from pipeline.stages import run_target  # the stages import torch and datatrove: not for --help

            run_target(config)
    except StageInterrupted as error:
        log.warning("%s", error)
        sys.exit(StageInterrupted.exit_code)
    except (ConfigError, StageError) as error:
        log.error("%s", error)
        sys.exit(1)


def usage() -> str:
    """The `--help` text of conf/config.yaml. Hydra would compose the config and list every config group's options
    first (seconds) although the text shows none of them: it names no `$` variable of Hydra's (tests/unit/test_cli.py)."""
    with open(CONF_DIR / "config.yaml", encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["hydra"]["help"]["template"]


def main() -> None:
    try:
        command = preflight(sys.argv[1:])
    except (OverrideError, UnknownLanguageError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if command.help:
        print(usage())
        return
    sys.argv[1:] = command.argv
    register_configs(command.languages, command.base_shape)
    hydra_main()


if __name__ == "__main__":
    try:
        main()
    finally:
        # Out of the way of the interpreter's last collections at exit, which would visit every object of torch,
        # DeepSpeed and datatrove once more: about a second of each process (a Slurm job, a workflow's task).
        gc.freeze()
