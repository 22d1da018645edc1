"""Typed configuration of the pipeline, registered in Hydra's ConfigStore.

The YAML files under `conf/` give defaults; these dataclasses give types, so that a mistyped value
(`clean.heldout_fraction=abc`) or an unknown key fails before any work starts. Each language of
`conf/languages.yaml` becomes an option of the `lang` group, so `lang=nob` puts the whole entry,
filter thresholds included, into the config where `--cfg job` shows it and overrides can change it
(`lang.filters.line_punct_thr=0.15`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from pipeline.choices import closest_first
from pipeline.languages import LANGUAGES

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"
EMBEDDED_DATA_DIR = REPO_ROOT / "data"


@dataclass
class NGramLimit:
    """Gopher repetition limit: at most `max_fraction` of the characters in repeated `n`-grams."""

    n: int = MISSING
    max_fraction: float = MISSING


def _ngram_limits(*pairs: tuple[int, float]) -> list[NGramLimit]:
    return [NGramLimit(n, fraction) for n, fraction in pairs]


@dataclass
class FilterThresholds:
    """Per-language quality-filter thresholds; defaults are FineWeb's language-independent ones."""

    language_score: float = 0.65
    dup_line_frac: float = 0.3
    top_n_grams: List[NGramLimit] = field(default_factory=lambda: _ngram_limits((2, 0.2), (3, 0.18), (4, 0.16)))
    dup_n_grams: List[NGramLimit] = field(
        default_factory=lambda: _ngram_limits((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    )
    line_punct_thr: float = 0.12
    new_line_ratio: float = 0.3
    min_avg_word_length: int = 3
    max_avg_word_length: int = 10
    max_non_alpha_words_ratio: float = 0.8
    # None disables Gopher's stop-word check: English stop words would reject every other language.
    stopwords: Optional[List[str]] = None


@dataclass
class LanguageConfig:
    code: str = MISSING
    name: str = MISSING
    script: str = MISSING
    hplt_code: str = MISSING
    iso639_1: Optional[str] = None
    aliases: List[str] = field(default_factory=list)
    glotlid: List[str] = field(default_factory=list)
    flores: Optional[str] = None
    word_tokenizer: str = MISSING
    # False for the few entries beyond the 75 HPLT v1.2 languages (e.g. Faroese).
    in_hplt_v1_2: bool = True
    filters_source: str = "defaults"
    filters: FilterThresholds = field(default_factory=FilterThresholds)


@dataclass
class LanguageIdConfig:
    # A local GlotLID (or other fastText) model file. None: trust the corpus' own `lang` field.
    model: Optional[str] = None
    # Minimum score; None takes the language's `filters.language_score`.
    threshold: Optional[float] = None


@dataclass
class DedupConfig:
    enabled: bool = True
    n_grams: int = 5
    num_buckets: int = 14
    hashes_per_bucket: int = 8
    seed: int = 1


@dataclass
class CleanConfig:
    lid: LanguageIdConfig = field(default_factory=LanguageIdConfig)
    gopher_repetition: bool = True
    gopher_quality: bool = True
    fineweb_quality: bool = True
    c4: bool = False
    gopher_min_doc_words: int = 50
    dedup: DedupConfig = field(default_factory=DedupConfig)
    heldout_fraction: float = 0.02
    # Output shards are cut at this many bytes (compressed); -1 means one shard per task.
    shard_bytes: int = 256 * 2**20
    # datatrove tasks (units of work, each a share of the input files); None: as many as workers.
    tasks: Optional[int] = None


@dataclass
class ClusterConfig:
    name: str = "local"
    # `local` runs datatrove's LocalPipelineExecutor; `slurm` submits datatrove's Slurm jobs.
    executor: str = "local"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpu_time: str = "12:00:00"
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    # Extra `#SBATCH` options, e.g. {"qos": "normal"}.
    sbatch_args: dict = field(default_factory=dict)
    # Shell lines run before the job's Python command (module loads, container setup).
    env_command: Optional[str] = None


@dataclass
class PipelineConfig:
    stage: str = MISSING
    lang: LanguageConfig = MISSING
    work_dir: str = "work"
    raw_dir: str = str(EMBEDDED_DATA_DIR)
    workers: int = 1
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)


def register_configs() -> None:
    """Register the schema and one `lang` option per language table entry."""
    cs = ConfigStore.instance()
    cs.store(name="pipeline_schema", node=PipelineConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    for code, entry in LANGUAGES.items():
        cs.store(group="lang", name=code, node=language_config(code, entry))


def language_config(code: str, entry: dict) -> LanguageConfig:
    """The table's entry as a typed config; its `[n, fraction]` pairs become NGramLimits."""
    table_filters = dict(entry.get("filters") or {})
    for key in ("top_n_grams", "dup_n_grams"):
        if key in table_filters:
            table_filters[key] = [{"n": n, "max_fraction": f} for n, f in table_filters[key]]
    filters = OmegaConf.merge(OmegaConf.structured(FilterThresholds), table_filters)
    fields = {k: v for k, v in entry.items() if k != "filters"}
    return LanguageConfig(code=code, filters=OmegaConf.to_object(filters), **fields)


def validate(cfg: PipelineConfig) -> None:
    """Checks that types alone cannot express; each error names the key and what is allowed."""
    from pipeline.stages import TARGETS

    if cfg.stage not in TARGETS:
        raise ConfigError("stage", cfg.stage, closest_first(cfg.stage, TARGETS))
    if not 0.0 <= cfg.clean.heldout_fraction < 1.0:
        raise ConfigError("clean.heldout_fraction", cfg.clean.heldout_fraction, ["a number in [0, 1)"])
    if cfg.workers < 1:
        raise ConfigError("workers", cfg.workers, ["an integer >= 1"])
    if cfg.clean.tasks is not None and cfg.clean.tasks < 1:
        raise ConfigError("clean.tasks", cfg.clean.tasks, ["null", "an integer >= 1"])
    if cfg.cluster.executor not in ("local", "slurm"):
        raise ConfigError("cluster.executor", cfg.cluster.executor, ["local", "slurm"])
    if cfg.clean.lid.model is not None and not os.path.isfile(cfg.clean.lid.model):
        raise ConfigError("clean.lid.model", cfg.clean.lid.model, ["a path to a local fastText/GlotLID .bin file"])


class ConfigError(ValueError):
    def __init__(self, key: str, value, allowed) -> None:
        allowed_text = ", ".join(str(a) for a in allowed)
        super().__init__(f"Invalid value for `{key}`: {value!r}. Allowed: {allowed_text}.")
        self.key = key
