"""`--cfg job` with each value's origin: the config as Hydra composes it, each value followed by a
comment that names the layer which set it last.

The layers, in the order Hydra merges them (pipeline/conf/config.yaml's defaults list): the defaults
(the dataclasses of pipeline/config.py), each config group's option (`cluster=`, `mix=`, the
`model=` preset, the `scale`: `demo` for the demo's model, `full` with model.base's shape from its
config.json; the language table's entry for `lang=`), pipeline/conf/config.yaml's own keys, and the
command line; last, the base-model rules fill the keys whose default depends on whether model.base
is given (pipeline/config.py: BASE_MODEL_RULES). Hydra's own `--cfg job` prints the same config
without them; it still answers `--cfg` with a package, `--config-dir` and the other flags this does
not take.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import yaml

from pipeline.config import CONF_DIR, FULL_SCALE, SCALE_GROUP, ruled_values
from pipeline.config_keys import flatten

_RESOLVE = "--resolve"


def shows_job_config(argv: list[str]) -> bool:
    """Whether `argv` asks for `--cfg job` alone (with `--resolve` at most) among `key=value`
    overrides."""
    flags = [arg for arg in argv if arg.startswith("-") and arg != _RESOLVE]
    if flags == ["--cfg=job"]:
        return True
    return flags in (["--cfg"], ["-c"]) and argv[argv.index(flags[0]) + 1 :][:1] == ["job"]


def _overrides(argv: list[str]) -> list[str]:
    """The `key=value` arguments: what is left once the flags and `--cfg`'s value are taken out."""
    return [
        arg
        for i, arg in enumerate(argv)
        if not arg.startswith("-") and not (i and argv[i - 1] in ("--cfg", "-c"))
    ]


def _keys(tree: Any, prefix: str) -> set[str]:
    return {f"{prefix}.{key}" if prefix else key for key in flatten(tree)}


def _option_keys(group: str, option: str, shape: Optional[dict]) -> tuple[str, set[str]]:
    """(label, dotted keys) of a config group's option: a YAML file under pipeline/conf/, the
    language table's entry, or the full scale with model.base's shape."""
    if group == "lang":
        return f"lang={option} (pipeline/conf/languages.yaml)", {"lang"}
    if group == SCALE_GROUP and option == FULL_SCALE:
        return "model.base's config.json", _keys(shape or {}, "model")
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():  # a schema option (cluster_schema): the defaults
        return "", set()
    text = path.read_text(encoding="utf-8")
    package = "" if "# @package _global_" in text else group
    label = f"preset {group}={option}" if group == "model" else f"{group}={option}"
    return label, _keys(yaml.safe_load(text) or {}, package)


def _layers(
    choices: dict, overrides: list[str], shape: Optional[dict]
) -> list[tuple[str, set[str]]]:
    """(label, keys it sets), lowest layer first."""
    config_yaml = yaml.safe_load((CONF_DIR / "config.yaml").read_text(encoding="utf-8"))
    groups = [next(iter(entry)) for entry in config_yaml["defaults"] if isinstance(entry, dict)]
    layers = [_option_keys(group, choices[group], shape) for group in groups if choices.get(group)]
    own = {key: value for key, value in config_yaml.items() if key not in ("defaults", "hydra")}
    layers.append(("pipeline/conf/config.yaml", _keys(own, "")))
    typed = {arg.split("=", 1)[0].lstrip("+~") for arg in overrides if "=" in arg}
    layers.append(("command line", typed - set(groups)))
    return layers


def origin_of(layers: list[tuple[str, set[str]]]) -> Callable[[str], str]:
    """The label of the last layer that sets `path`, the key itself, a key inside it or a section
    around it."""

    def origin(path: str) -> str:
        for label, keys in reversed(layers):
            if any(
                key == path or key.startswith(f"{path}.") or path.startswith(f"{key}.")
                for key in keys
            ):
                return label
        return "default"

    return origin


def _scalar(value: Any) -> str:
    if value == "???":
        return value
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30).rstrip(
        "\n"
    )
    return text[:-4] if text.endswith("\n...") else text


def annotated_yaml(
    tree: dict, origin: Callable[[str], str], indent: str = "", prefix: str = ""
) -> list[str]:
    """`tree` as YAML lines, each value's line ending in `# <its origin>`."""
    lines = []
    for key, value in tree.items():
        path, head = f"{prefix}{key}", f"{indent}{_scalar(key)}:"
        if isinstance(value, dict) and value:
            lines += [head, *annotated_yaml(value, origin, indent + "  ", f"{path}.")]
        elif isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
            block = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=1 << 30)
            lines += [
                f"{head}  # {origin(path)}",
                *(f"{indent}  {line}" for line in block.splitlines()),
            ]
        else:
            lines.append(f"{head} {_scalar(value)}  # {origin(path)}")
    return lines


def job_config_with_origins(argv: list[str], shape: Optional[dict]) -> str:
    """What `--cfg job` prints for `argv` (the checked command line, pipeline/overrides.py), with
    the origins."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = _overrides(argv)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    tree = OmegaConf.to_container(cfg, resolve=_RESOLVE in argv)
    origin = origin_of(_layers(choices, overrides, shape))
    return "\n".join(annotated_yaml(tree, _with_base_model_rules(tree, origin)))


def _with_base_model_rules(tree: dict, origin: Callable[[str], str]) -> Callable[[str], str]:
    """Set in `tree` the keys of BASE_MODEL_RULES that no layer set, as the run will
    (pipeline/config.py), and name the rule as their origin."""
    given = tree["model"]["base"] is not None
    ruled = ruled_values(given, lambda section, name: tree[section][name])
    for key, value in ruled.items():
        section, name = key.split(".")
        tree[section][name] = value
    label = f"rule: model.base {'given' if given else 'not given'}"
    return lambda path: label if path in ruled else origin(path)
