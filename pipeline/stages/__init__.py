"""The stages, and the recipe: which stage runs for which language, after which. `stage=all` runs
the recipe's steps here, in order; `stage=workflow` (pipeline/workflow/) submits the same steps to
Slurm, each waiting for the steps it `needs`. Each stage module exposes `STAGE` (a contract.Stage).

For every language of a run: clean -> mix -> tokenizer -> pack -> warmup -> pretrain -> evaluate.
Before the languages' mix, once for all of them, the steps that make what the mix replays of the
base model's language (`model.base_lang`, English by default; pipeline/conf/mix/default.yaml):
- with `model.base`: that language's clean text, when the raw folder has it (without it the mix goes
  on without, as it says), and the base's own samples of it (`replay`), when `replay.tokens` asks
  for them;
- without (the demo): nothing is downloaded, so the pipeline pretrains a small base itself, from
  scratch, on the embedded text of that language (clean .. pretrain with `init=scratch` and the
  `demo_base.train` budget), in `${work_dir}/<model.base_lang>/pretrain/hf` like any pretrain
  output, so the stage contract caches it; the languages then start from it. The base's language
  itself takes the same steps (its clean once).

Every step runs in cfg's run (`run=`, pipeline/run_folders.py): a named run's step whose config hash
is that of another run's finished output links to it instead of running (pipeline/contract.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from pipeline.config import REPLAY_TARGET, STAGE_NAMES, PipelineConfig
from pipeline.contract import Stage, execute, share_if_done
from pipeline.errors import StageError
from pipeline.languages import LANGUAGES, language_config
from pipeline.stage_outputs import EvaluateOutput, PretrainOutput
from pipeline.work_folder import DEFAULT_RUN

log = logging.getLogger(__name__)

# Every stage of the recipe: the chain of each language, and replay, which runs for the base's
# language only.
RECIPE_STAGES: tuple[str, ...] = (STAGE_NAMES[0], REPLAY_TARGET, *STAGE_NAMES[1:])


class _Stages(Mapping[str, Stage]):
    """Each stage by name (in RECIPE_STAGES' order), its module imported when first asked for: the
    data stages need no torch, so that `stage=clean` starts in under a second rather than three."""

    def __getitem__(self, name: str) -> Stage:
        if name not in RECIPE_STAGES:
            raise KeyError(name)
        stage = importlib.import_module(f"pipeline.stages.{name}").STAGE
        assert stage.name == name, f"pipeline/stages/{name}.py declares the stage {stage.name}"
        return stage

    def __iter__(self) -> Iterator[str]:
        return iter(RECIPE_STAGES)

    def __len__(self) -> int:
        return len(RECIPE_STAGES)


STAGES = _Stages()

Key = tuple[str, str]  # (language code, stage)


@dataclass(frozen=True)
class Step:
    """One stage for one language, with the config it runs with."""

    stage: str
    cfg: PipelineConfig
    # The steps whose outputs it reads: its language's previous step, and the base language's steps
    # (`shared`).
    previous: Key | None = None
    shared: tuple[Key, ...] = ()
    # A step of the base's language for the run's mix, which the run does not name: the command
    # line's settings of the run's languages' text (RUN_LANGUAGE_KEYS) do not apply to it.
    for_base: bool = False

    @property
    def needs(self) -> tuple[Key, ...]:
        return tuple(dict.fromkeys(((self.previous,) if self.previous else ()) + self.shared))

    @property
    def lang(self) -> str:
        return self.cfg.lang.code

    @property
    def key(self) -> Key:
        return self.lang, self.stage

    @property
    def downstream(self) -> tuple[str, ...]:
        """The stages of its language's chain after it, whose markers a rerun removes (their inputs
        change)."""
        return STAGE_NAMES[STAGE_NAMES.index(self.stage) + 1 :] if self.stage in STAGE_NAMES else ()


def chain(cfg: PipelineConfig, stages: tuple[str, ...], shared: tuple[Key, ...] = ()) -> list[Step]:
    """`stages` in order for cfg's language, each after the one before; its mix also after the
    `shared` steps."""
    steps: list[Step] = []
    for stage in stages:
        steps.append(
            Step(stage, cfg, steps[-1].key if steps else None, shared if stage == "mix" else ())
        )
    return steps


# What the command line says of the text of the languages it names: not of the base's language,
# which a run cleans for its mix with the table's entry and held-out sources.
RUN_LANGUAGE_KEYS = ("lang", "clean.heldout_sources")


def base_language_config(cfg: PipelineConfig) -> PipelineConfig:
    """cfg for the base model's language when the run does not name it: its table entry and held-out
    sources."""
    code = cfg.model.base_lang
    return dataclasses.replace(
        cfg,
        lang=language_config(code, LANGUAGES[code]),
        clean=dataclasses.replace(cfg.clean, heldout_sources=None),
    )


# The stages that make the demo's base: everything up to pretrain, which starts from random weights.
BASE_STAGES = ("clean", "mix", "tokenizer", "pack", "pretrain")


def demo_base_config(cfg: PipelineConfig) -> PipelineConfig:
    return dataclasses.replace(base_language_config(cfg), init="scratch", train=cfg.demo_base.train)


def demo_base_folder(cfg: PipelineConfig) -> Path:
    """The Hugging Face folder of the demo base (with its tokenizer), for `model.base`."""
    return PretrainOutput.at(demo_base_config(cfg)).export


def with_demo_base(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` as the recipe runs it: without `model.base`, the demo base is the base."""
    if cfg.model.base is not None:
        return cfg
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, base=str(demo_base_folder(cfg)))
    )


def base_language_steps(cfg: PipelineConfig, named: Mapping[str, PipelineConfig]) -> list[Step]:
    """What the languages' mix replays of the base's language, made once per run (module docstring);
    with the config of the run's languages (`named`) where the run names the base's language too."""
    code = cfg.model.base_lang
    if cfg.model.base is None:
        return [
            dataclasses.replace(step, for_base=True)
            for step in chain(demo_base_config(cfg), BASE_STAGES)
        ]
    base = named.get(code) or base_language_config(cfg)
    not_named = code not in named
    steps = []
    try:
        STAGES["clean"].describe_inputs(base)
    except StageError as missing:
        log.warning(
            "No text of the base model's language to replay (model.base_lang=%s): %s %s",
            cfg.model.base_lang,
            missing,
            "Only the base's own samples of it are replayed."
            if cfg.replay.tokens > 0
            else "The model may forget it.",
        )
    else:
        steps.append(Step("clean", base, for_base=not_named))
    if cfg.replay.tokens > 0:
        steps.append(Step(REPLAY_TARGET, base, for_base=not_named))
    return steps


def recipe(configs: Mapping[str, PipelineConfig]) -> list[Step]:
    """The steps for the languages of `configs` (code -> its config), each after the steps it needs:
    the base language's steps first (once), then each language's chain, whose mix waits for them."""
    first = next(iter(configs.values()))
    base = base_language_steps(first, configs)
    # The languages' mix waits for the base steps that no other base step waits for.
    waited = {key for step in base for key in step.needs}
    last = tuple(step.key for step in base if step.key not in waited)
    steps = {step.key: step for step in base}
    for code, cfg in configs.items():
        if code == first.model.base_lang and cfg.model.base is None:
            continue  # the demo's base is this language's recipe
        for step in chain(with_demo_base(cfg), STAGE_NAMES, last):
            steps.setdefault(step.key, step)
    return list(steps.values())


def run_target(cfg: PipelineConfig) -> None:
    """`stage=all` (the whole recipe for one language), or one stage."""
    if cfg.stage == "all":
        run_all(cfg)
        return
    step = Step(cfg.stage, cfg)
    if step.stage in STAGE_NAMES and cfg.run != DEFAULT_RUN:
        # A named run shares the earlier outputs of its config that other runs made.
        for earlier in STAGE_NAMES[: STAGE_NAMES.index(step.stage)]:
            share_if_done(STAGES[earlier], cfg, Step(earlier, cfg).downstream)
    execute(STAGES[step.stage], cfg, downstream=step.downstream)


def run_all(cfg: PipelineConfig) -> None:
    """The recipe's steps for one language, in order."""
    if cfg.model.base is None:
        log.info(
            "model.base is not set: using the demo's base model, pretrained from scratch on the "
            "embedded %s "
            "text in %s (made once, then reused). Give model.base=<Hugging Face folder> to start "
            "from a real "
            "one.",
            demo_base_config(cfg).lang.name,
            demo_base_folder(cfg),
        )
    for step in recipe({cfg.lang.code: cfg}):
        if execute(STAGES[step.stage], step.cfg, downstream=step.downstream) is None:
            log.info(
                "Stage %s for %s was submitted; run the command again when it has finished to go "
                "on.",
                step.stage,
                step.lang,
            )
            return
    if cfg.lang.code != cfg.model.base_lang or cfg.model.base is not None:
        log.info("The whole recipe for %s is done.", cfg.lang.code)
        print(f"Report: {EvaluateOutput.at(cfg).report_text.path}")
