"""The docs cannot drift from the config: every config key that README.md and docs/ name exists, and
every default that docs/configuration.md's table states as a plain value is the default the config
has."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config import CONF_DIR, register_configs
from tests.conftest import REPO

# The benchmark log is history: it names the options of its day, some since removed.
PAGES = [
    REPO / "README.md",
    *sorted(page for page in (REPO / "docs").rglob("*.md") if page.name != "benchmark-log.md"),
]
# A dotted name in backticks, maybe with a value (`clean.tasks=4`) or a `+` to add a key; `.stages`
# continues the section of the key before it in the same table cell.
NAMED = re.compile(r"`\+?([a-z_]*(?:\.[A-Za-z_0-9<>*]+)+)(?:=[^`]*)?`")
FILE_SUFFIXES = {
    "json",
    "md",
    "py",
    "yaml",
    "yml",
    "safetensors",
    "gz",
    "npy",
    "npz",
    "txt",
    "ftz",
    "bin",
    "model",
    "jsonl",
    "parquet",
    "pik",
    "lock",
    "sh",
    "toml",
    "csv",
    "tsv",
    "png",
    "slurm",
    "zst",
}
# Dotted names that are not keys: the workflow's arrays of the base's clean and replay.
NOT_KEYS = {"clean.base", "replay.base"}


@pytest.fixture(scope="module")
def config() -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["stage=all", "lang=nob"])


def _open(node) -> bool:
    """A section that takes any key (`mix.bytes_per_token`, `cluster.sbatch_args`, `lang.filters`)."""
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict


def _resolves(config: DictConfig, key: str) -> bool:
    node = config
    for part in key.split("."):
        if _open(node) or part.startswith("<") or part == "*":
            return True
        if isinstance(node, ListConfig):  # `mix.sources.0.path`: a list's entries have one shape
            if not part.isdigit():
                return False
            if not node:
                return True
            node = node[0]
            continue
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _named_keys(text: str, sections: set[str]) -> list[tuple[str, ...]]:
    """The config keys a page names, each as the spellings it may have: dotted names whose first
    part is a config section (files such as `tokenizer.json` and the workflow's arrays left out),
    and `.key` in the section of any key named before it in its line or list item (a table row:
    `train.log_every`, `.eval_every`)."""
    keys = []
    for line in re.sub(
        r"\n[ \t]+", " ", text
    ).splitlines():  # a list item's indented lines are its own
        before: list[str] = []
        for name in NAMED.findall(line):
            spellings = (
                tuple(f"{section}{name}" for section in before) if name.startswith(".") else (name,)
            )
            first, last = name.lstrip(".").split(".")[0], name.rsplit(".", 1)[-1]
            if (
                spellings
                and (name.startswith(".") or first in sections)
                and last not in FILE_SUFFIXES
                and name not in NOT_KEYS
            ):
                keys.append(spellings)
                if not name.startswith("."):
                    before.append(name.rsplit(".", 1)[0])
    return keys


def test_every_config_key_the_docs_name_exists(config):
    sections = {key for key in config if isinstance(config[key], (DictConfig, ListConfig))}
    missing = {}
    for page in PAGES:
        for spellings in _named_keys(page.read_text(encoding="utf-8"), sections):
            if not any(_resolves(config, key) for key in spellings):
                missing.setdefault(str(page.relative_to(REPO)), []).append(" or ".join(spellings))
    assert missing == {}
    assert (
        len(_named_keys((REPO / "docs" / "configuration.md").read_text(encoding="utf-8"), sections))
        > 50
    )


def _stated(key: str, default: str, config: DictConfig):
    """A table's default for `key` as a value, or None when it is prose (`the target x
    mix.max_epochs`) or another key of the config or of `key`'s section (`workers`,
    `cpus_per_task`)."""
    value = default.strip().strip("`").split(" (")[0]
    section = key.rsplit(".", 1)[0] if "." in key else ""
    if (
        value in config
        or section
        and OmegaConf.select(config, f"{section}.{value}", default="absent") != "absent"
    ):
        return None
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if re.fullmatch(r"-?\d*\.\d+(e-?\d+)?|-?\d+e-?\d+", value):
        return float(value)
    if default.strip().startswith("`") and re.fullmatch(r"[\w:.-]+", value):
        return value
    return None


def _demo_keys() -> set[str]:
    """The keys the demo scale sets (the composed config is the demo's): the table states the
    defaults, and the page says what the recipe (pipeline/conf/scale/demo.yaml) changes."""

    def flat(node, prefix=""):
        for key, value in node.items():
            yield from (
                flat(value, f"{prefix}{key}.")
                if isinstance(value, DictConfig)
                else [f"{prefix}{key}"]
            )

    return set(flat(OmegaConf.load(CONF_DIR / "scale" / "demo.yaml")))


def test_the_defaults_docs_configuration_states_are_the_configs(config):
    """Rows `| key | default | meaning |` with one key and a plain default; prose defaults are read
    by people."""
    checked, wrong, demo = 0, {}, _demo_keys()
    for line in (REPO / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[a-z_]+(\.[a-z_0-9]+)*`", cells[0]):
            continue
        key = cells[0].strip("`")
        stated = _stated(key, cells[1], config)
        if stated is None or key in demo or not _resolves(config, key):
            continue
        actual = OmegaConf.select(config, key)
        if isinstance(actual, (DictConfig, ListConfig)):
            continue
        checked += 1
        if actual != stated and not (isinstance(stated, float) and actual == pytest.approx(stated)):
            wrong[key] = (cells[1], actual)
    assert wrong == {}
    assert checked > 20
