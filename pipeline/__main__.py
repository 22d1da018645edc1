"""`python -m pipeline stage=<stage> lang=<code> [overrides]`: the one entry point of every stage."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.config import register_configs, validate
from pipeline.errors import ConfigError, StageError, StageInterrupted
from pipeline.languages import UnknownLanguageError
from pipeline.overrides import OverrideError, preflight
from pipeline.targets import WORKFLOW_TARGETS, check_target

log = logging.getLogger("pipeline")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    try:
        config = OmegaConf.to_object(cfg)
        validate(config)
        check_target(config)
        if config.stage in WORKFLOW_TARGETS:
            from pipeline.workflow import run_workflow_target  # imports every stage, hence torch: not for --help

            run_workflow_target(config)
        else:
            from pipeline.stages import run_target  # the stages import torch and datatrove: not for --help

            run_target(config)
    except StageInterrupted as error:
        log.warning("%s", error)
        sys.exit(StageInterrupted.exit_code)
    except (ConfigError, StageError) as error:
        log.error("%s", error)
        sys.exit(1)


def main() -> None:
    try:
        sys.argv[1:] = preflight(sys.argv[1:])
    except (OverrideError, UnknownLanguageError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    register_configs()
    hydra_main()


if __name__ == "__main__":
    main()
