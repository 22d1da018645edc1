"""The pipeline's whole configuration, assembled from the sections each package owns, and registered
in Hydra's ConfigStore.

The YAML files under `pipeline/conf/` give defaults; the dataclasses give types, so that a mistyped
value (`clean.heldout_fraction=abc`) or an unknown key fails before any work starts. Each package
owns its section and its checks (`corpus/clean_config.py` has `clean`, `mixing/mix_config.py` has
`mix` ...); this module only puts them together. Each language of `pipeline/conf/languages.yaml`
becomes an option of the `lang` group, so `lang=nob` puts the whole entry, filter thresholds
included, into the config where `--cfg job` shows it and overrides can change it
(`lang.filters.line_punct_thr=0.15`).

What `stage=` accepts, torch-free so that the command line checks it in a moment.

The recipe's stages in order (each a module of pipeline/stages/ under the stage contract), `all` for
the whole chain of one language, the Slurm targets of pipeline/workflow/, which take several
languages, `plan` (pipeline/memory_fit/), which takes none, and `compare`
(pipeline/stages/compare.py), which reports on a language's runs (`run=`, pipeline/run_folders.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from pipeline.cluster import ClusterConfig, WorkflowConfig, validate_cluster
from pipeline.corpus.clean_config import CleanConfig, validate_clean
from pipeline.errors import ConfigError, closest_first
from pipeline.evaluation.eval_config import EvalConfig, validate_eval
from pipeline.languages import LANGUAGES, LanguageConfig, language_config
from pipeline.memory_fit.plan_config import PlanConfig, validate_plan
from pipeline.mixing.mix_config import MixConfig, ReplayConfig, validate_mix, validate_replay
from pipeline.model.base_shape import check_base_shape
from pipeline.model.model_config import ExportConfig, ModelConfig, validate_export, validate_model
from pipeline.packing.pack_config import PackConfig, validate_pack
from pipeline.parallel.parallel_config import (
    ParallelConfig,
    check_tensor_parallel,
    validate_parallel,
)
from pipeline.run_folders import (
    ALL_RUNS,
    CONTINUE_PREFIX,
    check_run_name,
    continued_run,
    swept_run_name,
)
from pipeline.tokenization.tokenizer_config import TokenizerConfig, validate_tokenizer
from pipeline.training.train_config import TrainConfig, validate_eval_tasks, validate_training
from pipeline.warmup.warmup_config import WarmupConfig, validate_warmup
from pipeline.work_folder import DEFAULT_RUN

# The YAML defaults and the language table ship inside the package (package data), so that an
# installed wheel needs no checkout.
CONF_DIR = Path(__file__).resolve().parent / "conf"
# The checkout the package sits in (`pip install -e .`). The embedded samples are its `data/`: a
# wheel does not carry them (docs/install.md), and an installed package's `raw_dir` names no folder
# until it is given.
REPO_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DATA_DIR = REPO_ROOT / "data"
KERNEL_BACKENDS = (
    "auto",
    "reference",
    "triton",
)  # pipeline/kernels/backend.py (which imports torch)

# The scale group: `demo` (pipeline/conf/scale/demo.yaml, CPU-sized budgets) for the demo's model,
# pipeline/conf/config.yaml's default preset without model.base; `full`, the defaults as they are,
# which the command line chooses for a model.base (whose shape it merges over the preset's) or
# another preset (pipeline/overrides.py: with_full_scale).
SCALE_GROUP, FULL_SCALE, DEMO_MODEL = "scale", "full", "tiny"
FULL_SCALE_OVERRIDE = f"{SCALE_GROUP}={FULL_SCALE}"

# Keys whose default depends on whether a base model is given (null in the dataclasses): (with
# model.base, without).
BASE_MODEL_RULES = {"tokenizer.extend_base": (True, False)}

PRETRAIN_INITS = ("warmup", "hf", "scratch")
RESUME = ("auto", "never")


@dataclass
class DemoBaseConfig:
    """The demo's base model when `model.base` is not given: `stage=all` pretrains one from scratch
    on the embedded text of `model.base_lang` (`lang=eng init=scratch`, in `${work_dir}/eng/`) and
    caches it there."""

    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class PipelineConfig:
    stage: str = MISSING
    # Every stage but workflow and status needs one language (`lang=nob`).
    lang: Optional[LanguageConfig] = None
    # stage=workflow and stage=status: several languages (`langs=[nob,nno]`, or `langs=all` for the
    # 75 HPLT v1.2 languages); the command line resolves aliases and checks each code against the
    # table.
    langs: Optional[List[str]] = None
    work_dir: str = "work"
    raw_dir: str = str(EMBEDDED_DATA_DIR)
    # An experiment's name: its stage outputs in <work_dir>/<lang>/runs/<run>/, those of the same
    # config shared with the other runs (pipeline/run_folders.py); `default`: <work_dir>/<lang>/.
    run: str = DEFAULT_RUN
    # stage=compare: the runs to compare (`runs=[a,b]`); null or `all`: every run of the language.
    runs: Optional[List[str]] = None
    workers: int = 1
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    mix: MixConfig = field(default_factory=MixConfig)
    # stage=replay: text the base writes in its own language, for the mix's replay (used with
    # model.base).
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    # The transformer's shape: presets in pipeline/conf/model/ (`model=bloom-560m`).
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    # pretrain: where its weights start (`warmup`: the warmup stage's checkpoint; `hf`: model.base,
    # which must use the pack's tokenizer; `scratch`: random; `continue:<run>`: that run's final
    # training state, weights, optimizer and data position), and whether it continues from its
    # latest checkpoint.
    init: str = "warmup"
    resume: str = "auto"
    train: TrainConfig = field(default_factory=TrainConfig)
    # The training stages' kernels: `auto` (Triton on a GPU, the PyTorch reference on a CPU),
    # `reference` anywhere (to rule a kernel out), or `triton` (pipeline/kernels/backend.py).
    kernels: str = "auto"
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demo_base: DemoBaseConfig = field(default_factory=DemoBaseConfig)
    # stage=plan and pretrain's layout check: the device a layout is planned against.
    plan: PlanConfig = field(default_factory=PlanConfig)
    # warmup and pretrain: the transformers folder they write (hf/).
    export: ExportConfig = field(default_factory=ExportConfig)


def register_configs(
    languages: Optional[Iterable[str]] = None, base_shape: Optional[dict] = None
) -> None:
    """Register the schema, a `lang` option for each of `languages` (None: every language of the
    table) and the `scale=full` option with the shape of `model.base` (pipeline/model/base_shape.py;
    None: the preset's, without a base or for one only Hydra resolves).

    Only the languages a run names are registered (the command line knows them,
    pipeline/overrides.py): Hydra copies the whole ConfigStore each time it looks up a config group,
    so all 76 entries made `--cfg job` take seconds."""
    # A multirun names each job's run from its swept values (pipeline/overrides.py: `run=` is this
    # resolver when the command line sweeps and names no run).
    OmegaConf.register_new_resolver(SWEPT_RUN_RESOLVER, _swept_run, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="pipeline_schema", node=PipelineConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    for code in LANGUAGES if languages is None else languages:
        cs.store(group="lang", name=code, node=language_config(code, LANGUAGES[code]))
    register_full_scale(base_shape)


SWEPT_RUN_RESOLVER = "swept_run"


def _swept_run() -> str:
    from hydra.core.hydra_config import HydraConfig  # set in every job of a multirun

    return swept_run_name(HydraConfig.get().job.override_dirname)


def register_full_scale(shape: Optional[dict]) -> None:
    """The option FULL_SCALE_OVERRIDE selects: the defaults as they are, and `model.base`'s shape
    over the `model=` preset's (as a config, not as `model.<key>=` overrides: OmegaConf cannot merge
    a rope_scaling dict over a preset's null)."""
    ConfigStore.instance().store(
        group=SCALE_GROUP, name=FULL_SCALE, node={"model": shape or {}}, package="_global_"
    )


def ruled_values(base_given: bool, value_of: Callable[[str, str], object]) -> dict[str, object]:
    """The keys of BASE_MODEL_RULES that no layer set (`value_of(section, name)` still null), with
    the value the rule gives them: the one place the rule is applied, to the run's config and to
    `--cfg job`'s (pipeline/config_origins.py)."""
    ruled = {}
    for key, (with_base, without) in BASE_MODEL_RULES.items():
        if value_of(*key.split(".")) is None:
            ruled[key] = with_base if base_given else without
    return ruled


def with_base_model_rules(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with each key of BASE_MODEL_RULES that no layer set (still null) set by whether
    model.base is given."""
    value_of = lambda section, name: getattr(getattr(cfg, section), name)  # noqa: E731
    for key, value in ruled_values(cfg.model.base is not None, value_of).items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


def validate(cfg: PipelineConfig) -> None:
    """Checks that types alone cannot express, section by section; each error names the key and what
    is allowed. Which `stage=` and `lang`/`langs` a target takes is checked where the targets are
    (pipeline/stages/)."""
    if cfg.workers < 1:
        raise ConfigError("workers", cfg.workers, ["an integer >= 1"])
    validate_cluster(cfg.cluster)
    validate_clean(cfg.clean)
    validate_mix(cfg.mix)
    validate_replay(cfg.replay)
    validate_tokenizer(cfg.tokenizer)
    for key, use in (
        ("keep_base", "adopt"),
        ("extend_base", "extend"),
    ):  # extend_base: set with a base only
        if getattr(cfg.tokenizer, key) and cfg.tokenizer.base is None and cfg.model.base is None:
            raise ConfigError(
                f"tokenizer.{key}",
                True,
                [
                    "false (train a tokenizer for the language)",
                    "true with tokenizer.base=<tokenizer.json or folder> or model.base=<Hugging "
                    f"Face folder> to {use}",
                ],
            )
    validate_pack(cfg.pack)
    validate_model(cfg.model)
    if cfg.model.base is not None:
        check_base_shape(cfg.model)
    validate_parallel(cfg.parallel)
    check_tensor_parallel(cfg.model, cfg.parallel.tp)
    validate_warmup(cfg.warmup)
    if not cfg.warmup.train_head and cfg.model.tie_embeddings:
        raise ConfigError(
            "warmup.train_head",
            False,
            [
                "true (a tied head is the input embedding, which always trains)",
                "false with an untied model (model.tie_embeddings=false)",
            ],
        )
    validate_training(cfg.warmup.train, cfg.parallel, prefix="warmup.train")
    validate_training(cfg.train, cfg.parallel, prefix="train")
    validate_runs(cfg)
    if cfg.resume not in RESUME:
        raise ConfigError("resume", cfg.resume, RESUME)
    validate_eval(cfg.eval)
    for prefix, train in (("warmup.train", cfg.warmup.train), ("train", cfg.train)):
        validate_eval_tasks(train.eval_tasks, cfg.eval.tasks, prefix)
    validate_plan(cfg.plan)
    validate_export(cfg.export)
    if cfg.model.base is None:  # the demo's base is made only without one
        validate_training(cfg.demo_base.train, cfg.parallel, prefix="demo_base.train")
        validate_eval_tasks(cfg.demo_base.train.eval_tasks, cfg.eval.tasks, "demo_base.train")
    if cfg.model.base_lang not in LANGUAGES:
        raise ConfigError(
            "model.base_lang",
            cfg.model.base_lang,
            closest_first(cfg.model.base_lang, list(LANGUAGES)),
        )
    if cfg.kernels not in KERNEL_BACKENDS:
        raise ConfigError("kernels", cfg.kernels, KERNEL_BACKENDS)


def validate_runs(cfg: PipelineConfig) -> None:
    """`run`, `runs` and `init` (which may continue another run) name runs that can be."""
    check_run_name("run", cfg.run)
    for name in cfg.runs or []:
        if name != ALL_RUNS or len(cfg.runs) > 1:
            check_run_name("runs", name)
    continued = continued_run(cfg.init)
    if cfg.init not in PRETRAIN_INITS and continued is None:
        raise ConfigError(
            "init",
            cfg.init,
            [*PRETRAIN_INITS, f"{CONTINUE_PREFIX}<run> (e.g. {CONTINUE_PREFIX}default)"],
        )
    if continued is not None:
        check_run_name("init", continued)
        if continued == cfg.run:
            raise ConfigError(
                "init",
                cfg.init,
                [
                    f"{CONTINUE_PREFIX}<another run than run={cfg.run}>: a continued run writes "
                    "folders of its own (give it a name with run=<name>)"
                ],
            )


STAGE_NAMES: tuple[str, ...] = (
    "clean",
    "mix",
    "tokenizer",
    "pack",
    "warmup",
    "pretrain",
    "evaluate",
)
# stage=workflow submits the chain to Slurm for one or many languages; stage=status shows how far it
# got.
WORKFLOW_TARGETS: tuple[str, ...] = ("workflow", "status")
# stage=plan prints whether the training layout fits the device (pipeline/memory_fit/); it needs no
# language.
PLAN_TARGET = "plan"
# stage=compare writes one report on a language's runs (pipeline/stages/compare.py): not part of the
# recipe, run when the runs are evaluated.
COMPARE_TARGET = "compare"
# stage=replay samples the base model's own language for the mix (pipeline/stages/replay.py); it
# runs for the base's language, outside the chain of the language being trained, which only reads
# it.
REPLAY_TARGET = "replay"
TARGETS: tuple[str, ...] = (
    *STAGE_NAMES,
    "all",
    REPLAY_TARGET,
    *WORKFLOW_TARGETS,
    PLAN_TARGET,
    COMPARE_TARGET,
)


def check_target(cfg) -> None:
    """`stage=` is a target; a stage (or `all`) runs for one language, the workflow targets for
    several."""
    if cfg.stage not in TARGETS:
        raise ConfigError("stage", cfg.stage, closest_first(cfg.stage, TARGETS))
    if cfg.stage not in (*WORKFLOW_TARGETS, PLAN_TARGET) and (
        cfg.lang is None or cfg.langs is not None
    ):
        raise ConfigError(
            "lang",
            cfg.langs,
            [
                "one ISO 639-3 code such as lang=nob (langs= is for stage=workflow "
                "and stage=status; sweep a stage with -m lang=nob,nno)"
            ],
        )
