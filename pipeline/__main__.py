"""`python -m pipeline stage=<stage> lang=<code> [overrides]`: the one entry point of every stage."""

from __future__ import annotations

import gc
import logging
import os
import sys
import tempfile
from typing import Optional

import hydra
import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.config_origins import job_config_with_origins, shows_job_config
from pipeline.config import (
    COMPARE_TARGET,
    CONF_DIR,
    PLAN_TARGET,
    WORKFLOW_TARGETS,
    PipelineConfig,
    check_target,
    register_configs,
    validate,
    with_base_model_rules,
)
from pipeline.errors import ConfigError, StageError, StageInterrupted, os_error_message
from pipeline.languages import UnknownLanguageError
from pipeline.memory_fit import print_plan
from pipeline.overrides import CommandLine, OverrideError, preflight

log = logging.getLogger("pipeline")

# Hydra's flags after which it prints something and runs no stage, making no run folder.
_NO_RUN_FLAGS = {"--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc"}


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    try:
        config: PipelineConfig = with_base_model_rules(OmegaConf.to_object(cfg))
        validate(config)
        check_target(config)
        if config.stage in WORKFLOW_TARGETS:
            from pipeline.workflow import (
                run_workflow_target,
            )  # imports every stage, hence torch: not for --help

            run_workflow_target(config)
        elif config.stage == PLAN_TARGET:
            print_plan(config)
        elif config.stage == COMPARE_TARGET:
            from pipeline.stages.compare import compare_runs  # matplotlib: not for --help

            compare_runs(config)
        else:
            from pipeline.stages import (
                run_target,
            )  # the stages import torch and datatrove: not for --help

            run_target(config)
    except StageInterrupted as error:
        log.warning("%s", error)
        sys.exit(StageInterrupted.exit_code)
    except (ConfigError, StageError) as error:
        log.error("%s", error)
        sys.exit(1)
    except OSError as error:
        if (
            error.errno is None
        ):  # a library's own error in OSError's clothes (a model it cannot load), no OS error
            raise
        # datatrove's worker processes hand their OSError back as it was raised, errno and path
        # included.
        log.error("%s", os_error_message(error, {"work_dir": cfg.work_dir, "raw_dir": cfg.raw_dir}))
        sys.exit(1)


def usage() -> str:
    """The `--help` text of pipeline/conf/config.yaml. Hydra would compose the config and list every
    config group's options first (seconds) although the text shows none of them: it names no `$`
    variable of Hydra's (tests/unit/test_cli.py)."""
    with open(CONF_DIR / "config.yaml", encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["hydra"][
            "help"
        ]["template"]


def _work_dir(argv: list[str]) -> Optional[str]:
    """The work folder the command line names, as Hydra reads it; None for one only Hydra can tell
    (an interpolation, a sweep over several)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [arg for arg in argv if arg.startswith("work_dir=")]
    if not given:
        return PipelineConfig.work_dir
    parsed = OverridesParser.create().parse_override(given[-1])
    value = None if parsed.is_sweep_override() else str(parsed.value())
    return None if value is None or "${" in value else value


def check_work_dir(command: CommandLine) -> None:
    """Write a page into the work folder before Hydra makes its run folder there (config copies, the
    log): Hydra catches an OS error of its own writes and prints a traceback, HYDRA_FULL_ERROR or
    not, before any code of ours runs. Writing, not only making the folder, finds a full disk too:
    tmpfs makes a folder on a full one."""
    work_dir = _work_dir(command.argv)
    if work_dir is None or any(arg.split("=", 1)[0] in _NO_RUN_FLAGS for arg in command.argv):
        return
    one_language = command.languages is not None and len(command.languages) == 1
    folder = os.path.join(work_dir, command.languages[0]) if one_language else work_dir
    try:
        os.makedirs(folder, exist_ok=True)
        try:
            with tempfile.TemporaryFile(dir=folder) as probe:
                probe.write(bytes(4096))
                probe.flush()
        except OSError as error:
            raise OSError(
                error.errno, error.strerror, folder
            ) from None  # the probe's own name means nothing
    except OSError as error:
        print(f"error: {os_error_message(error, {'work_dir': work_dir})}", file=sys.stderr)
        sys.exit(1)


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
    if shows_job_config(command.argv):
        print(job_config_with_origins(command.argv, command.base_shape))
        return
    check_work_dir(command)
    # On a full disk the log file takes no more lines: each would print a traceback of logging's own
    # on stderr, above the one line that says what happened (the console still shows every line).
    logging.raiseExceptions = False
    hydra_main()


if __name__ == "__main__":
    try:
        main()
    finally:
        # Out of the way of the interpreter's last collections at exit, which would visit every
        # object of torch, DeepSpeed and datatrove once more: about a second of each process (a
        # Slurm job, a workflow's task).
        gc.freeze()
