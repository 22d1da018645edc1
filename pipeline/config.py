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
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from pipeline.choices import closest_first
from pipeline.languages import LANGUAGES
from pipeline.model.config import ModelConfig, validate_model
from pipeline.parallel.tensor_parallel_fit import check_tensor_parallel
from pipeline.planning.config import PlanConfig, validate_plan
from pipeline.training.config import ParallelConfig, TrainConfig, validate_training

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


# UTF-8 bytes per token of a ~32k-64k BPE vocabulary trained on the language, by ISO 15924 script:
# characters per token (about 4 in alphabets, 3 in abugidas, 1.5-2 in Han, Kana and Hangul) times
# UTF-8 bytes per character (1 for Latin, 2 for Cyrillic, Greek, Armenian, Hebrew and Arabic, 3 for
# the rest). Rough estimates that only serve the plan until `pack` counts the exact tokens.
DEFAULT_BYTES_PER_TOKEN = {
    "Latn": 4.0, "code": 3.5,
    "Cyrl": 7.0, "Grek": 7.0, "Armn": 7.0, "Hebr": 6.5, "Arab": 6.5,
    "Deva": 8.0, "Beng": 8.0, "Gujr": 8.0, "Guru": 8.0, "Knda": 8.0, "Mlym": 8.0, "Taml": 8.0,
    "Telu": 8.0, "Sinh": 8.0, "Mymr": 8.0, "Geor": 10.0, "Thai": 10.0,
    "Hang": 5.0, "Hans": 4.5, "Jpan": 4.5,
}


@dataclass
class MixSource:
    """A source the mix stage may draw on besides the target language's own clean corpus."""

    name: str = MISSING
    # A clean stage output (`${work_dir}/<lang>/clean`) or any folder of raw *.jsonl{,.gz,.zst}/*.parquet.
    path: Optional[str] = None
    # Lower numbers fill the budget first: related languages (1) before English (2) before code (3).
    priority: int = 1
    # At most this many passes over the source's unique tokens.
    max_epochs: float = 4.0
    # A fixed share of the budget (0.1 for 10%), planned before the target and the other sources.
    ratio: Optional[float] = None
    # ISO 15924 script of the text (or `code`); picks the bytes-per-token estimate.
    script: str = "Latn"
    # A missing path skips the source with a warning instead of failing (for defaults that need
    # another language's clean stage, which a fresh checkout has not run).
    optional: bool = False


@dataclass
class RehydrationRow:
    """Documents that stood for at least `min_cluster_size` near-duplicates (up to the next row) get `weight`."""

    min_cluster_size: int = MISSING
    weight: float = MISSING


def _fineweb2_rehydration() -> list[RehydrationRow]:
    # FineWeb-2's default: cluster size 1 -> x1, 2 -> x2, 3-4 -> x3, 5-99 -> x5, 100+ -> x8.
    return [RehydrationRow(size, weight) for size, weight in ((1, 1.0), (2, 2.0), (3, 3.0), (5, 5.0), (100, 8.0))]


@dataclass
class RehydrationConfig:
    enabled: bool = False
    weights: List[RehydrationRow] = field(default_factory=_fineweb2_rehydration)


@dataclass
class MixConfig:
    # Token budget of the training run (`260e9`); None: the target's unique tokens x max_epochs, plus
    # the fixed ratios.
    tokens: Optional[float] = None
    # Cap on the target language's epochs (Muennighoff et al. 2023: up to ~4, repetition is nearly free).
    max_epochs: float = 4.0
    # The sources besides the target; defaults and examples in conf/mix/ (`mix=default`, `mix=nordic`).
    sources: List[MixSource] = field(default_factory=list)
    bytes_per_token: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BYTES_PER_TOKEN))
    # For scripts missing from `bytes_per_token`.
    default_bytes_per_token: float = 4.0
    rehydration: RehydrationConfig = field(default_factory=RehydrationConfig)


# GPT-4's split pattern (cl100k, as in Llama 3) with two changes for many languages: combining marks
# (\p{M}: Devanagari vowel signs, decomposed accents) stay inside words, and the English contractions
# ('s, 't, 're ...) are not special (`'s` still splits off as punctuation + letters). Runs of 1-3
# digits, punctuation with its leading space, newlines and other whitespace runs are pieces of their own.
DEFAULT_PRETOKENIZER_PATTERN = (
    r"[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}{1,3}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOKENIZER_BACKENDS = ("bytelevel_bpe", "sentencepiece")
SENTENCEPIECE_MODEL_TYPES = ("unigram", "bpe")
NORMALIZATIONS = ("none", "nfkc")


@dataclass
class SpecialTokens:
    """The special tokens, at ids 0-3 in this order."""

    bos: str = "<s>"
    eos: str = "</s>"
    pad: str = "<pad>"
    unk: str = "<unk>"

    def in_id_order(self) -> list[str]:
        return [self.bos, self.eos, self.pad, self.unk]


@dataclass
class TokenizerConfig:
    backend: str = "bytelevel_bpe"
    # For backend=sentencepiece.
    sentencepiece_model_type: str = "unigram"
    # Rounded up to a multiple of 128 (tensor-parallel embedding shards and GPU kernels want it).
    vocab_size: int = 32768
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    # `none` keeps decode(encode(x)) == x; `nfkc` folds compatibility characters and breaks that.
    normalization: str = "none"
    # For backend=bytelevel_bpe: the regex that splits text into pre-tokens before BPE.
    pretokenizer_pattern: str = DEFAULT_PRETOKENIZER_PATTERN
    # The longest token the trainer may learn: bytes for bytelevel_bpe, characters for sentencepiece.
    # None: no limit for bytelevel_bpe, SentencePiece's own 16 for sentencepiece.
    max_token_length: Optional[int] = None
    # For backend=bytelevel_bpe: a pair seen fewer times is never merged.
    min_frequency: int = 2
    # Cap on the training text sampled from the mix plan's sources (UTF-8 bytes): bounds memory and time.
    sample_bytes: int = 1_000_000_000
    # Cap on the held-out text the report evaluates (UTF-8 bytes).
    eval_bytes: int = 100_000_000
    seed: int = 1
    # The base model's tokenizer to compare with: a tokenizer.json file or a folder holding one.
    base: Optional[str] = None
    # Train nothing: adopt the base's tokenizer (`base`, else `model.base`'s tokenizer.json), to continue
    # pretraining with the old vocabulary (the baseline the new tokenizer and the warm start are measured against).
    keep_base: bool = False


@dataclass
class PackConfig:
    # Picks which documents are read once more for a fractional epoch (2.5 epochs: a seeded half of the
    # tokens a third time). The training run's sampler has its own seed for the order.
    seed: int = 1
    # Documents per call of the tokenizer (datatrove's DocumentTokenizer batch_size): speed and memory, not results.
    batch_size: int = 1000


WARMUP_INITS = ("mean", "random")
PRETRAIN_INITS = ("warmup", "hf", "scratch")
RESUME = ("auto", "never")


def _warmup_training() -> TrainConfig:
    # LTG's NorMistral-11B warm start: constant 1e-4 after a short warm-up, Adam beta2 0.95, weight decay 0.1.
    return TrainConfig(steps=100, global_batch_size=16, micro_batch_size=4, lr=1e-4, schedule="constant",
                       warmup_steps=10, beta2=0.95, weight_decay=0.1, eval_tokens=32768)


@dataclass
class WarmupConfig:
    # New embedding rows: `mean` of the old pieces that spell each new token (copies for shared tokens),
    # or `random`, the baseline it is measured against.
    init: str = "mean"
    # Train BLOOM's LayerNorm after the embedding as well (it belongs to the embedding, not the body).
    train_embedding_norm: bool = False
    train: TrainConfig = field(default_factory=_warmup_training)


EVAL_DOCUMENT_STARTS = ("eos", "bos")


@dataclass
class EvalConfig:
    # Held-out text: null takes the clean stage's held-out split; or a file or folder of JSONL/Parquet (the
    # clean reader's formats) or of plain text, one document per line (FLORES' `nob_Latn.devtest`).
    path: Optional[str] = None
    # Tokens per window; null takes the model's max_seq_len.
    seq_len: Optional[int] = None
    # Tokens scored per window after the first; the rest of the window is context. Null: half the window.
    stride: Optional[int] = None
    # The token fed before each document's first token: `eos`, as the pack stage separates documents (and
    # BLOOM was trained), or `bos` for models trained with one (Llama 3).
    document_start: str = "eos"
    # Cap on the UTF-8 bytes evaluated (whole documents, in order).
    max_bytes: int = 10_000_000
    # Windows per forward pass.
    batch_size: int = 8


@dataclass
class DemoBaseConfig:
    """The demo's base model when `model.base` is not given: `stage=all` pretrains one from scratch on this
    language's embedded text (`lang=eng init=scratch`, in `${work_dir}/eng/`) and caches it there."""

    lang: str = "eng"
    train: TrainConfig = field(default_factory=TrainConfig)


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
    # Training stages inside a Slurm allocation start their ranks with `srun` (one task per GPU/GCD):
    # extra srun options (e.g. LUMI's CPU binding per GCD), a command the Python command runs in (a
    # container: `singularity exec ... image.sif`), and environment variables for the ranks ($VARS expanded).
    srun_args: list = field(default_factory=list)
    container: Optional[str] = None
    env: dict = field(default_factory=dict)
    # stage=workflow runs each CPU stage of a language as one job on this many CPUs (its `workers`; datatrove
    # runs locally inside the job); null: cpus_per_task.
    workflow_cpus: Optional[int] = None
    # stage=workflow's GPU stages (warmup, pretrain): their partition (null: `partition`), GPUs per node (GCDs on
    # LUMI; 0: a CPU-only cluster, whose ranks are CPU processes on one node), CPUs per rank, time limit and memory
    # per node (null: the partition's default). Nodes = parallel.tp x pp x dp / gpus_per_node.
    gpu_partition: Optional[str] = None
    gpus_per_node: int = 0
    gpu_cpus_per_task: int = 1
    gpu_time: str = "12:00:00"
    gpu_mem_per_node_gb: Optional[int] = None


@dataclass
class WorkflowConfig:
    """stage=workflow and stage=status (pipeline/workflow/): every stage as a Slurm job array, one task per language."""

    # Print the scripts and the dependency graph; submit nothing.
    dry_run: bool = False
    # The stages to chain (in the pipeline's order); null: all of them. Stages left out are neither checked nor run.
    stages: Optional[List[str]] = None
    # GPU stages get SIGUSR1 this many seconds before their time limit: they checkpoint and requeue themselves.
    signal_seconds: int = 300
    # The jobs' Python; null: the interpreter that runs stage=workflow (right for a virtual environment on a shared
    # file system). With cluster.container, the container's (e.g. `python3`).
    python: Optional[str] = None


@dataclass
class PipelineConfig:
    stage: str = MISSING
    # Every stage but workflow and status needs one language (`lang=nob`).
    lang: Optional[LanguageConfig] = None
    # stage=workflow and stage=status: several languages (`langs=[nob,nno]`, or `langs=all` for the 75 HPLT v1.2
    # languages); the command line resolves aliases and checks each code against the table.
    langs: Optional[List[str]] = None
    work_dir: str = "work"
    raw_dir: str = str(EMBEDDED_DATA_DIR)
    workers: int = 1
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    mix: MixConfig = field(default_factory=MixConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    # The transformer's shape: presets in conf/model/ (`model=bloom-560m`).
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    # pretrain: where its weights start (`warmup`: the warmup stage's checkpoint; `hf`: model.base, which must
    # use the pack's tokenizer; `scratch`: random), and whether it continues from its latest checkpoint.
    init: str = "warmup"
    resume: str = "auto"
    train: TrainConfig = field(default_factory=TrainConfig)
    # The training stages' kernels: `auto` (Triton on a GPU, the PyTorch reference on a CPU), `reference`
    # anywhere (to rule a kernel out), or `triton` (pipeline/kernels/backend.py).
    kernels: str = "auto"
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demo_base: DemoBaseConfig = field(default_factory=DemoBaseConfig)
    # stage=plan and pretrain's layout check: the device a layout is planned against.
    plan: PlanConfig = field(default_factory=PlanConfig)


def register_configs() -> None:
    """Register the schema and one `lang` option per language table entry."""
    cs = ConfigStore.instance()
    cs.store(name="pipeline_schema", node=PipelineConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
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
    from pipeline.stages import PLAN_TARGET, TARGETS, WORKFLOW_TARGETS

    if cfg.stage not in TARGETS:
        raise ConfigError("stage", cfg.stage, closest_first(cfg.stage, TARGETS))
    if cfg.stage in WORKFLOW_TARGETS:
        from pipeline.workflow.selection import validate_workflow

        validate_workflow(cfg)
    elif cfg.stage != PLAN_TARGET and (cfg.lang is None or cfg.langs is not None):
        raise ConfigError("lang", cfg.langs, ["one ISO 639-3 code such as lang=nob (langs= is for stage=workflow "
                                              "and stage=status; sweep a stage with -m lang=nob,nno)"])
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
    validate_mix(cfg.mix)
    validate_tokenizer(cfg.tokenizer)
    if cfg.tokenizer.keep_base and cfg.tokenizer.base is None and cfg.model.base is None:
        raise ConfigError("tokenizer.keep_base", True, [
            "false (train a tokenizer for the language)",
            "true with tokenizer.base=<tokenizer.json or folder> or model.base=<Hugging Face folder> to adopt"])
    validate_pack(cfg.pack)
    validate_model(cfg.model)
    check_tensor_parallel(cfg.model, cfg.parallel.tp)
    validate_training(cfg.warmup.train, cfg.parallel, prefix="warmup.train")
    if cfg.warmup.init not in WARMUP_INITS:
        raise ConfigError("warmup.init", cfg.warmup.init, WARMUP_INITS)
    validate_training(cfg.train, cfg.parallel, prefix="train")
    if cfg.init not in PRETRAIN_INITS:
        raise ConfigError("init", cfg.init, PRETRAIN_INITS)
    if cfg.resume not in RESUME:
        raise ConfigError("resume", cfg.resume, RESUME)
    validate_eval(cfg.eval)
    validate_plan(cfg.plan)
    validate_training(cfg.demo_base.train, cfg.parallel, prefix="demo_base.train")
    if cfg.demo_base.lang not in LANGUAGES:
        raise ConfigError("demo_base.lang", cfg.demo_base.lang, closest_first(cfg.demo_base.lang, list(LANGUAGES)))
    from pipeline.kernels.backend import BACKENDS  # imports torch, which a bad stage name need not wait for

    if cfg.kernels not in BACKENDS:
        raise ConfigError("kernels", cfg.kernels, BACKENDS)


def validate_mix(mix: MixConfig) -> None:
    if mix.tokens is not None and not mix.tokens > 0:
        raise ConfigError("mix.tokens", mix.tokens, [
            "a positive number of tokens, e.g. 260e9",
            "null (the target's unique tokens x mix.max_epochs, plus the fixed ratios)"])
    if not mix.max_epochs > 0:
        raise ConfigError("mix.max_epochs", mix.max_epochs, ["a positive number of epochs, e.g. 4"])
    for script, value in {**mix.bytes_per_token, "default": mix.default_bytes_per_token}.items():
        if not value > 0:
            key = "mix.default_bytes_per_token" if script == "default" else f"mix.bytes_per_token.{script}"
            raise ConfigError(key, value, ["a positive number of UTF-8 bytes per token, e.g. 4.0"])
    names = [source.name for source in mix.sources]
    if len(set(names)) != len(names):
        raise ConfigError("mix.sources", names, ["sources with distinct names"])
    for i, source in enumerate(mix.sources):
        if not source.path:
            raise ConfigError(f"mix.sources.{i}.path", source.path,
                              ["a clean stage output such as ${work_dir}/eng/clean",
                               "a folder of raw *.jsonl{,.gz,.zst}/*.parquet files"])
        if not source.max_epochs > 0:
            raise ConfigError(f"mix.sources.{i}.max_epochs", source.max_epochs, ["a positive number of epochs"])
        if source.ratio is not None and not 0 < source.ratio < 1:
            raise ConfigError(f"mix.sources.{i}.ratio", source.ratio, ["null", "a share of the budget in (0, 1)"])
    ratios = [source.ratio for source in mix.sources if source.ratio is not None]
    if sum(ratios) >= 1:
        raise ConfigError("mix.sources.*.ratio", ratios,
                          ["fixed ratios that sum to less than 1 (the target language needs a share)"])
    rows = [(row.min_cluster_size, row.weight) for row in mix.rehydration.weights]
    sizes = [size for size, _ in rows]
    if not rows or sizes[0] != 1 or sizes != sorted(set(sizes)) or any(not weight > 0 for _, weight in rows):
        raise ConfigError("mix.rehydration.weights", [{"min_cluster_size": s, "weight": w} for s, w in rows],
                          ["rows sorted by distinct min_cluster_size, the first 1, with positive weights, e.g. "
                           "FineWeb-2's [{min_cluster_size: 1, weight: 1}, {min_cluster_size: 2, weight: 2}, "
                           "{min_cluster_size: 3, weight: 3}, {min_cluster_size: 5, weight: 5}, "
                           "{min_cluster_size: 100, weight: 8}]"])


def validate_tokenizer(tok: TokenizerConfig) -> None:
    from tokenizers import Regex

    from pipeline.tokenization.folder import base_tokenizer_file

    for key, value, allowed in (("backend", tok.backend, TOKENIZER_BACKENDS),
                                ("sentencepiece_model_type", tok.sentencepiece_model_type, SENTENCEPIECE_MODEL_TYPES),
                                ("normalization", tok.normalization, NORMALIZATIONS)):
        if value not in allowed:
            raise ConfigError(f"tokenizer.{key}", value, closest_first(value, allowed))
    specials = tok.special_tokens.in_id_order()
    if len(set(specials)) != len(specials) or any(not t or t != "".join(t.split()) for t in specials):
        raise ConfigError("tokenizer.special_tokens", specials, ["four distinct non-empty strings without whitespace"])
    smallest = 256 + len(specials)
    if tok.vocab_size <= smallest:
        raise ConfigError("tokenizer.vocab_size", tok.vocab_size, [
            f"an integer > {smallest} (256 byte tokens + {len(specials)} special tokens, before any learned token); "
            "it is rounded up to a multiple of 128, e.g. 32768"])
    if tok.max_token_length is not None and not 2 <= tok.max_token_length <= 512:
        raise ConfigError("tokenizer.max_token_length", tok.max_token_length,
                          ["null (no limit for bytelevel_bpe, 16 for sentencepiece)", "an integer in [2, 512]"])
    for key in ("min_frequency", "seed"):
        if getattr(tok, key) < 0:
            raise ConfigError(f"tokenizer.{key}", getattr(tok, key), ["an integer >= 0"])
    for key in ("sample_bytes", "eval_bytes"):
        if getattr(tok, key) < 1:
            raise ConfigError(f"tokenizer.{key}", getattr(tok, key),
                              ["a positive number of UTF-8 bytes, e.g. 1000000000"])
    try:
        Regex(tok.pretokenizer_pattern)
    except Exception as error:  # tokenizers raises a bare Exception for Oniguruma syntax errors
        raise ConfigError("tokenizer.pretokenizer_pattern", tok.pretokenizer_pattern,
                          [f"an Oniguruma regular expression ({error})"]) from None
    if tok.base is not None and base_tokenizer_file(tok.base) is None:
        raise ConfigError("tokenizer.base", tok.base, [
            "null", "a local tokenizer.json file", "a local folder holding a tokenizer.json (a Hugging Face model "
            "folder)"])


def validate_eval(evaluation: EvalConfig) -> None:
    if evaluation.path is not None and not os.path.exists(evaluation.path):
        raise ConfigError("eval.path", evaluation.path, ["null (the clean stage's held-out split)",
                                                         "an existing file or folder of held-out text"])
    for key in ("seq_len", "stride"):
        value = getattr(evaluation, key)
        if value is not None and value < 1:
            raise ConfigError(f"eval.{key}", value, ["null", "an integer >= 1"])
    if evaluation.seq_len is not None and evaluation.stride is not None and evaluation.stride > evaluation.seq_len:
        raise ConfigError("eval.stride", evaluation.stride, [f"at most eval.seq_len ({evaluation.seq_len})"])
    if evaluation.document_start not in EVAL_DOCUMENT_STARTS:
        raise ConfigError("eval.document_start", evaluation.document_start, EVAL_DOCUMENT_STARTS)
    for key in ("max_bytes", "batch_size"):
        if getattr(evaluation, key) < 1:
            raise ConfigError(f"eval.{key}", getattr(evaluation, key), ["an integer >= 1"])


def validate_pack(pack: PackConfig) -> None:
    if pack.seed < 0:
        raise ConfigError("pack.seed", pack.seed, ["an integer >= 0"])
    if pack.batch_size < 1:
        raise ConfigError("pack.batch_size", pack.batch_size, ["a positive number of documents per tokenizer call, "
                                                               "e.g. 1000"])


class ConfigError(ValueError):
    def __init__(self, key: str, value, allowed) -> None:
        allowed_text = ", ".join(str(a) for a in allowed)
        super().__init__(f"Invalid value for `{key}`: {value!r}. Allowed: {allowed_text}.")
        self.key = key
