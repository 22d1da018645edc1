"""The stages, in the order the recipe runs them. Each module exposes `STAGE` (a contract.Stage).

The demo's base model, for `stage=all` without `model.base`: nothing is downloaded, so the pipeline
pretrains a small one itself, from scratch, on the embedded text of `model.base_lang` (English), with the
run's own model shape, tokenizer settings and `demo_base.train` budget. It lives in
`${work_dir}/<model.base_lang>/pretrain/hf` like any pretrain output, so the stage contract caches it: the
next run finds it up to date and goes straight on.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from pathlib import Path
from typing import Iterator, Mapping

from pipeline.config import REPLAY_TARGET, STAGE_NAMES, PipelineConfig
from pipeline.contract import Stage, execute, stage_dir
from pipeline.errors import StageError
from pipeline.languages import LANGUAGES, language_config

log = logging.getLogger(__name__)


class _Stages(Mapping[str, Stage]):
    """Each stage by name (pipeline/config.py's order), its module imported when first asked for: the data stages
    need no torch, so that `stage=clean` starts in under a second rather than three."""

    def __getitem__(self, name: str) -> Stage:
        if name not in STAGE_NAMES:
            raise KeyError(name)
        stage = importlib.import_module(f"pipeline.stages.{name}").STAGE
        assert stage.name == name, f"pipeline/stages/{name}.py declares the stage {stage.name}"
        return stage

    def __iter__(self) -> Iterator[str]:
        return iter(STAGE_NAMES)

    def __len__(self) -> int:
        return len(STAGE_NAMES)


STAGES = _Stages()


def run_target(cfg: PipelineConfig) -> None:
    """`stage=all` (the whole recipe for one language), `stage=replay` or one stage of the chain."""
    if cfg.stage == "all":
        run_all(cfg)
    elif cfg.stage == REPLAY_TARGET:
        run_replay(cfg)
    else:
        run_chain(cfg, (cfg.stage,))


def prepare_base_language(cfg: PipelineConfig) -> None:
    """What the default mix replays of `model.base_lang` (conf/mix/default.yaml): its clean text, when the raw folder
    has that language (without it the mix goes on without, as it says), and the base's own samples of it
    (`stage=replay`) when `replay.tokens` asks for them."""
    if cfg.model.base_lang == cfg.lang.code:
        return
    base_lang = dataclasses.replace(cfg, lang=language_config(cfg.model.base_lang, LANGUAGES[cfg.model.base_lang]))
    try:
        STAGES["clean"].describe_inputs(base_lang)
    except StageError as missing:
        log.warning("No text of the base model's language to replay (model.base_lang=%s): %s %s", cfg.model.base_lang,
                    missing, "Only the base's own samples of it are replayed." if cfg.replay.tokens > 0 else
                    "The model may forget it.")
    else:
        run_chain(base_lang, ("clean",))
    if cfg.replay.tokens > 0:
        run_replay(base_lang)


def run_replay(cfg: PipelineConfig) -> None:
    """stage=replay, for cfg's language: outside the chain of STAGE_NAMES, which only reads it (through the mix)."""
    execute(importlib.import_module(f"pipeline.stages.{REPLAY_TARGET}").STAGE, cfg)


def run_chain(cfg: PipelineConfig, names: tuple[str, ...]) -> bool:
    """Run `names` in order; False if one went to Slurm (the rest must wait for it)."""
    for name in names:
        later = STAGE_NAMES[STAGE_NAMES.index(name) + 1:]
        marker = execute(STAGES[name], cfg, downstream=later)
        if marker is None:
            log.info("Stage %s for %s was submitted; run the command again when it has finished to go on.",
                     name, cfg.lang.code)
            return False
    return True


def run_all(cfg: PipelineConfig) -> None:
    """The whole recipe for one language; without `model.base`, first the demo's own base model, with it, first the
    text of the base's language that the mix replays."""
    if cfg.model.base is not None:
        prepare_base_language(cfg)
    else:
        base_cfg = demo_base_config(cfg)
        log.info("model.base is not set: using the demo's base model, pretrained from scratch on the embedded %s "
                 "text in %s (made once, then reused). Give model.base=<Hugging Face folder> to start from a real "
                 "one.", base_cfg.lang.name, demo_base_folder(cfg))
        if not run_chain(base_cfg, BASE_STAGES) or cfg.lang.code == base_cfg.lang.code:
            return
        cfg = with_demo_base(cfg)
    if run_chain(cfg, STAGE_NAMES):
        report = stage_dir(cfg, "evaluate") / "report.md"
        log.info("The whole recipe for %s is done.", cfg.lang.code)
        print(f"Report: {report}")


# The stages that make the base: everything up to pretrain, which starts from random weights.
BASE_STAGES = ("clean", "mix", "tokenizer", "pack", "pretrain")


def demo_base_config(cfg: PipelineConfig) -> PipelineConfig:
    lang = cfg.model.base_lang
    return dataclasses.replace(cfg, lang=language_config(lang, LANGUAGES[lang]), init="scratch",
                               train=cfg.demo_base.train)


def demo_base_folder(cfg: PipelineConfig) -> Path:
    """The Hugging Face folder of the demo base (with its tokenizer), for `model.base`."""
    return stage_dir(demo_base_config(cfg), "pretrain") / "hf"


def with_demo_base(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` as `stage=all` runs it: without `model.base`, the demo base is the base."""
    if cfg.model.base is not None:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, base=str(demo_base_folder(cfg))))
