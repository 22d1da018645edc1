"""The typed `mix` section (the token budget, the sources besides the target language, rehydration)
and the `replay` section (text the base model writes in its own language, a source of the default
mix)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from omegaconf import MISSING

from pipeline.errors import ConfigError

# UTF-8 bytes per token of a ~32k-64k BPE vocabulary trained on the language, by ISO 15924 script:
# characters per token (about 4 in alphabets, 3 in abugidas, 1.5-2 in Han, Kana and Hangul) times
# UTF-8 bytes per character (1 for Latin, 2 for Cyrillic, Greek, Armenian, Hebrew and Arabic, 3 for
# the rest). Rough estimates that only serve the plan until `pack` counts the exact tokens.
DEFAULT_BYTES_PER_TOKEN = {
    "Latn": 4.0,
    "code": 3.5,
    "Cyrl": 7.0,
    "Grek": 7.0,
    "Armn": 7.0,
    "Hebr": 6.5,
    "Arab": 6.5,
    "Deva": 8.0,
    "Beng": 8.0,
    "Gujr": 8.0,
    "Guru": 8.0,
    "Knda": 8.0,
    "Mlym": 8.0,
    "Taml": 8.0,
    "Telu": 8.0,
    "Sinh": 8.0,
    "Mymr": 8.0,
    "Geor": 10.0,
    "Thai": 10.0,
    "Hang": 5.0,
    "Hans": 4.5,
    "Jpan": 4.5,
}


@dataclass
class MixSource:
    """A source the mix stage may draw on besides the target language's own clean corpus."""

    name: str = MISSING
    # A clean stage output (`${work_dir}/<lang>/clean`) or any folder of raw
    # *.jsonl{,.gz,.zst}/*.parquet.
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
    """Documents that stood for at least `min_cluster_size` near-duplicates (up to the next row) get
    `weight`."""

    min_cluster_size: int = MISSING
    weight: float = MISSING


def _fineweb2_rehydration() -> list[RehydrationRow]:
    # FineWeb-2's default: cluster size 1 -> x1, 2 -> x2, 3-4 -> x3, 5-99 -> x5, 100+ -> x8.
    return [
        RehydrationRow(size, weight)
        for size, weight in ((1, 1.0), (2, 2.0), (3, 3.0), (5, 5.0), (100, 8.0))
    ]


@dataclass
class RehydrationConfig:
    enabled: bool = False
    weights: List[RehydrationRow] = field(default_factory=_fineweb2_rehydration)


@dataclass
class MixConfig:
    # Token budget of the training run (`260e9`); None: the target's unique tokens x max_epochs,
    # plus the fixed ratios.
    tokens: Optional[float] = None
    # Cap on the target language's epochs (Muennighoff et al. 2023: up to ~4, repetition is nearly
    # free).
    max_epochs: float = 4.0
    # The sources besides the target; defaults and examples in pipeline/conf/mix/ (`mix=default`,
    # `mix=nordic`).
    sources: List[MixSource] = field(default_factory=list)
    bytes_per_token: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BYTES_PER_TOKEN))
    # For scripts missing from `bytes_per_token`.
    default_bytes_per_token: float = 4.0
    rehydration: RehydrationConfig = field(default_factory=RehydrationConfig)


@dataclass
class ReplayConfig:
    """`stage=replay`: documents sampled from `model.base` in its own language
    (pipeline/mixing/replay.py), which the default mix replays beside that language's text
    (pipeline/conf/mix/default.yaml)."""

    # Tokens to sample (of the base's tokenizer); 0: none. Only a `model.base` samples (the demo has
    # none).
    tokens: int = 6_000_000
    # A document ends at the base's end-of-text token or after this many tokens.
    length: int = 1024
    # Documents sampled at once on each device; null: as many as half the GPU's free memory holds
    # with their KV cache (a small base is limited by launches, not arithmetic, so large batches are
    # what make it fast), 16 on a CPU, and no more than each device's share of the documents.
    batch_size: Optional[int] = None
    # The base's own distribution (temperature 1) without its least likely tokens: at top_p 1.0
    # SmolLM2-135M's samples drift into strings of no language within a few lines, at 0.9 they read
    # as web, code and textbook text.
    temperature: float = 1.0
    top_p: float = 0.9
    seed: int = 0


def validate_replay(replay: ReplayConfig) -> None:
    if replay.tokens < 0:
        raise ConfigError(
            "replay.tokens", replay.tokens, ["0 (no samples)", "a number of tokens, e.g. 6000000"]
        )
    if replay.length < 1:
        raise ConfigError("replay.length", replay.length, ["a number of tokens >= 1, e.g. 1024"])
    if replay.batch_size is not None and replay.batch_size < 1:
        raise ConfigError(
            "replay.batch_size",
            replay.batch_size,
            ["null (what fits half the GPU's free memory)", "a number of documents >= 1, e.g. 256"],
        )
    if not replay.temperature > 0:
        raise ConfigError(
            "replay.temperature",
            replay.temperature,
            ["a positive number, 1.0 for the base's own distribution"],
        )
    if not 0 < replay.top_p <= 1:
        raise ConfigError("replay.top_p", replay.top_p, ["a probability in (0, 1], 1.0 for no cut"])


def validate_mix(mix: MixConfig) -> None:
    if mix.tokens is not None and not mix.tokens > 0:
        raise ConfigError(
            "mix.tokens",
            mix.tokens,
            [
                "a positive number of tokens, e.g. 260e9",
                "null (the target's unique tokens x mix.max_epochs, plus the fixed ratios)",
            ],
        )
    if not mix.max_epochs > 0:
        raise ConfigError("mix.max_epochs", mix.max_epochs, ["a positive number of epochs, e.g. 4"])
    for script, value in {**mix.bytes_per_token, "default": mix.default_bytes_per_token}.items():
        if not value > 0:
            key = (
                "mix.default_bytes_per_token"
                if script == "default"
                else f"mix.bytes_per_token.{script}"
            )
            raise ConfigError(key, value, ["a positive number of UTF-8 bytes per token, e.g. 4.0"])
    names = [source.name for source in mix.sources]
    if len(set(names)) != len(names):
        raise ConfigError("mix.sources", names, ["sources with distinct names"])
    for i, source in enumerate(mix.sources):
        if not source.path:
            raise ConfigError(
                f"mix.sources.{i}.path",
                source.path,
                [
                    "a clean stage output such as ${work_dir}/eng/clean",
                    "a folder of raw *.jsonl{,.gz,.zst}/*.parquet files",
                ],
            )
        if not source.max_epochs > 0:
            raise ConfigError(
                f"mix.sources.{i}.max_epochs", source.max_epochs, ["a positive number of epochs"]
            )
        if source.ratio is not None and not 0 < source.ratio < 1:
            raise ConfigError(
                f"mix.sources.{i}.ratio", source.ratio, ["null", "a share of the budget in (0, 1)"]
            )
    ratios = [source.ratio for source in mix.sources if source.ratio is not None]
    if sum(ratios) >= 1:
        raise ConfigError(
            "mix.sources.*.ratio",
            ratios,
            ["fixed ratios that sum to less than 1 (the target language needs a share)"],
        )
    rows = [(row.min_cluster_size, row.weight) for row in mix.rehydration.weights]
    sizes = [size for size, _ in rows]
    if (
        not rows
        or sizes[0] != 1
        or sizes != sorted(set(sizes))
        or any(not weight > 0 for _, weight in rows)
    ):
        raise ConfigError(
            "mix.rehydration.weights",
            [{"min_cluster_size": s, "weight": w} for s, w in rows],
            [
                "rows sorted by distinct min_cluster_size, the first 1, with positive weights, "
                "e.g. "
                "FineWeb-2's [{min_cluster_size: 1, weight: 1}, {min_cluster_size: 2, weight: 2}, "
                "{min_cluster_size: 3, weight: 3}, {min_cluster_size: 5, weight: 5}, "
                "{min_cluster_size: 100, weight: 8}]"
            ],
        )
