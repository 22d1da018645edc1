"""The demo's base model, for `stage=all` without `model.base`: nothing is downloaded, so the pipeline
pretrains a small one itself, from scratch, on the embedded text of `model.base_lang` (English), with the
run's own model shape, tokenizer settings and `demo_base.train` budget. It lives in
`${work_dir}/<model.base_lang>/pretrain/hf` like any pretrain output, so the stage contract caches it: the
next run finds it up to date and goes straight on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.contract import stage_dir
from pipeline.languages import LANGUAGES, language_config

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
