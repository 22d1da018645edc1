"""What a workflow covers: its languages (each with its array index), its stages, and each
language's config as its jobs will see it; and the checks that stage=workflow and stage=status make
before anything else.

A language's array index is its position in pipeline/conf/languages.yaml, so it keeps its index in
any subset of languages, and a later submission can wait for an earlier array's task of the same
language (`aftercorr`). New languages go at the end of the table.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pipeline.config import PipelineConfig, register_full_scale, with_base_model_rules
from pipeline.errors import ConfigError, closest_first
from pipeline.languages import LANGUAGES, language_config, resolve_languages
from pipeline.overrides import override_key, with_full_scale
from pipeline.stages import RECIPE_STAGES, Step, demo_base_folder, recipe
from pipeline.workflow.jobs import work_dir_override

TABLE_INDEX: dict[str, int] = {code: index for index, code in enumerate(LANGUAGES)}


def languages(cfg: PipelineConfig) -> list[str]:
    """The workflow's language codes, in table order."""
    codes = cfg.langs if cfg.langs is not None else [cfg.lang.code]
    return sorted(set(codes), key=TABLE_INDEX.__getitem__)


def steps(cfg: PipelineConfig, configs: dict) -> list[Step]:
    """The recipe's steps for the languages of `configs` (code -> its jobs' config), those of
    `workflow.stages`."""
    chosen = cfg.workflow.stages
    return [step for step in recipe(configs) if chosen is None or step.stage in chosen]


def languages_argument(cfg: PipelineConfig) -> str:
    """The languages as the command line gives them (`langs=all` for all of HPLT's)."""
    if cfg.lang is not None:
        return f"lang={cfg.lang.code}"
    return (
        "langs=all"
        if languages(cfg) == resolve_languages("all")
        else f"langs=[{','.join(languages(cfg))}]"
    )


def language_configs(cfg: PipelineConfig, job_overrides: list[str], codes: list[str]) -> dict:
    """Each language's config as its jobs compose it, to check its markers against.

    Hydra composes the jobs' overrides once (with the absolute work_dir, so that interpolations such
    as the mix sources' `${work_dir}` come out as in the jobs), and each language's table entry then
    takes the place of `lang` (composing costs about 0.2 s: 15 s for 75 languages); overrides of
    `lang.*`, which every language's entry takes, have each language composed.
    """
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    # A job reads model.base's shape when it starts (pipeline/overrides.py); this process may not
    # have a model.base of its own (stage=status with the recorded overrides), so it reads the shape
    # the jobs get.
    job_overrides, shape = with_full_scale(
        job_overrides
    )  # as the job's own command line check does
    register_full_scale(shape)

    def composed(code: str) -> PipelineConfig:
        overrides = [*job_overrides, f"stage={cfg.stage}", f"lang={code}"]
        return with_base_model_rules(
            OmegaConf.to_object(compose(HydraConfig.get().job.config_name, overrides))
        )

    if any(override_key(override).startswith("lang.") for override in job_overrides):
        return {code: composed(code) for code in codes}
    first = composed(codes[0])
    return {
        code: dataclasses.replace(first, lang=language_config(code, LANGUAGES[code]))
        for code in codes
    }


def validate_workflow(cfg: PipelineConfig) -> None:
    """Checks of stage=workflow and stage=status; each error names the key and what to do."""
    if cfg.lang is not None and cfg.langs is not None:
        raise ConfigError(
            "langs",
            cfg.langs,
            ["either lang=<code> (one language) or langs=[...] (several), not both"],
        )
    codes = cfg.langs if cfg.langs is not None else [cfg.lang.code] if cfg.lang is not None else []
    if not codes:
        raise ConfigError(
            "langs",
            codes,
            ["lang=<code>", "langs=[nob,nno]", "langs=all (the 75 HPLT v1.2 languages)"],
        )
    for code in codes:
        if (
            code not in LANGUAGES
        ):  # the command line resolves aliases; this guards configs given another way
            raise ConfigError("langs", code, closest_first(code, LANGUAGES)[:8])
    chosen = cfg.workflow.stages
    if chosen is not None:
        unknown = [name for name in chosen if name not in RECIPE_STAGES]
        if unknown or not chosen:
            raise ConfigError(
                "workflow.stages",
                chosen,
                ["null (every stage)", f"a list of stages out of {', '.join(RECIPE_STAGES)}"],
            )
    if cfg.stage != "workflow":
        return
    work_dir_override(
        Path(cfg.work_dir).absolute()
    )  # raises if the path cannot be passed on to a job
    if cfg.model.base is None and not set(chosen or RECIPE_STAGES) <= {"clean"}:
        _refuse_without_base(cfg)
    elif cfg.model.base is not None and not os.path.isdir(cfg.model.base):
        raise ConfigError(
            "model.base",
            cfg.model.base,
            ["the local Hugging Face folder of the base model (with its tokenizer.json)"],
        )


def _refuse_without_base(cfg: PipelineConfig) -> None:
    """The demo's base model is made by stage=all (its pretrain runs with settings of its own, not
    the jobs')."""
    demo = demo_base_folder(cfg)
    raise ConfigError(
        "model.base",
        cfg.model.base,
        [
            "the local Hugging Face folder that warmup starts from (with its tokenizer.json)",
            "the demo's small English base model: build it once with `python -m pipeline "
            "stage=all lang=nob "
            f"work_dir={cfg.work_dir}`, which caches it in {demo}, then give model.base={demo}",
            "or run only the clean stage without a base: workflow.stages=[clean]",
        ],
    )
