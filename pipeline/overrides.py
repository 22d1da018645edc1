"""Checks the command line before Hydra composes it, so that mistakes fail with a useful message at
once.

Hydra already rejects unknown keys and mistyped values, but only after composing the config and in
its own words; this adds what it cannot know: the closest valid keys, stage and language names
(closest first), the language aliases (`lang=nb` becomes `lang=nob`), each value checked against its
key's type, and which languages the run needs (so that only those are registered as `lang` options,
pipeline/config.py).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf.errors import ValidationError
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode

from pipeline.config import (
    COMPARE_TARGET,
    DEMO_MODEL,
    FULL_SCALE_OVERRIDE,
    PLAN_TARGET,
    SCALE_GROUP,
    SWEPT_RUN_RESOLVER,
    TARGETS,
    WORKFLOW_TARGETS,
    PipelineConfig,
)
from pipeline.errors import closest_first
from pipeline.languages import resolve_language, resolve_languages
from pipeline.model.base_shape import base_shape
from pipeline.model.hf_config import CheckpointError
from pipeline.run_folders import ALL_RUNS

# Hydra flags that take the next argument as their value.
_FLAGS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--info",
    "-i",
    "--experimental-rerun",
}
_HELP_FLAGS = {"--help", "-h"}
_CONFIG_GROUPS = {"lang", "cluster", "mix", "model", SCALE_GROUP}
# A leaf's type -> the OmegaConf node that converts a command-line value to it, and how to name the
# type.
_TYPED_NODES = {
    int: (IntegerNode, "an integer"),
    float: (FloatNode, "a number"),
    bool: (BooleanNode, "true or false"),
}


class OverrideError(ValueError):
    pass


@dataclass
class CommandLine:
    """The checked command line: what to hand to Hydra, and what the run needs before it."""

    argv: list[str]
    # The languages whose `lang` options must exist; None: all (a sweep function may pick any).
    languages: Optional[tuple[str, ...]] = ()
    # `--help`: the usage text, without composing any config.
    help: bool = False
    # model.base's shape, to merge over the preset's (pipeline/config.py, FULL_SCALE_OVERRIDE).
    base_shape: Optional[dict] = None


def _dataclass_of(tp) -> Optional[type]:
    """The dataclass inside a field type such as `Foo` or `Optional[Foo]`, if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


@dataclass(frozen=True)
class Leaf:
    """A config key's field: its type and default (for the example in a message)."""

    type: Any
    default: Any = dataclasses.MISSING


def check_key(dotted: str) -> Optional[Leaf]:
    """Raise OverrideError if `dotted` is not a key of the pipeline config; returns the key's field,
    or None below a list or a free-form dict (cluster.sbatch_args), which Hydra checks."""
    cls, walked, entry_next, leaf = PipelineConfig, [], False, None
    for part in dotted.split("."):
        if entry_next:  # an index or key into a list or dict of dataclasses (mix.sources.0.path)
            entry_next = False
            walked.append(part)
            continue
        if cls is None:
            # below a leaf or inside a free-form dict (cluster.sbatch_args): Hydra checks the rest
            return None
        types = typing.get_type_hints(cls)
        if part not in types:
            prefix = ".".join(walked)
            known = [f"{prefix}.{name}" if prefix else name for name in types]
            typed = f"{prefix}.{part}" if prefix else part
            suggestions = closest_first(typed, known)[:3]
            raise OverrideError(
                f"Unknown config key `{dotted}`. Did you mean: "
                f"{', '.join(f'`{s}`' for s in suggestions)}? "
                "`python -m pipeline --cfg job stage=clean lang=nob` prints every key."
            )
        walked.append(part)
        default = next(
            (f.default for f in dataclasses.fields(cls) if f.name == part), dataclasses.MISSING
        )
        leaf = Leaf(types[part], default)
        cls = _dataclass_of(types[part])
        entry_next = cls is not None and typing.get_origin(types[part]) in (list, dict)
    return None if entry_next else leaf


def check_value(key: str, value: str, leaf: Leaf) -> None:
    """Raise OverrideError if `value` cannot become the integer, number or boolean that `key` holds;
    other types, interpolations, quoted values and sweeps are Hydra's to check."""
    args = typing.get_args(leaf.type)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), None) if optional else leaf.type
    if (
        base not in _TYPED_NODES
        or value.startswith(("'", '"'))
        or "${" in value
        or "," in value
        or _is_sweep_function(value)
    ):
        return
    node, expected = _TYPED_NODES[base]
    if optional and value == "null":
        return
    try:
        node(value=value)
    except ValidationError:
        default = str(leaf.default).lower() if base is bool else leaf.default
        example = "" if leaf.default in (None, dataclasses.MISSING) else f", e.g. {key}={default}"
        raise OverrideError(
            f"Invalid value for `{key}`: {value!r} is not {expected}. `{key}` takes "
            f"{expected}{' or null' if optional else ''}{example}."
        ) from None


def _split_override(arg: str) -> Optional[tuple[str, str, str]]:
    """(prefix, key, value) of a `key=value` override; None for anything else."""
    if "=" not in arg or arg.startswith("-"):
        return None
    key, value = arg.split("=", 1)
    prefix = ""
    while key[:1] in "+~":
        prefix, key = prefix + key[0], key[1:]
    return prefix, key, value


def override_key(arg: str) -> str:
    """The key of a `key=value` override without Hydra's `+`/`~` prefixes; "" for any other
    argument."""
    parsed = _split_override(arg)
    return parsed[1] if parsed else ""


def _is_sweep_function(value: str) -> bool:
    return any(
        value.startswith(f"{fn}(")
        for fn in ("choice", "range", "glob", "interval", "sort", "shuffle")
    )


def _is_sweep(value: str) -> bool:
    return "," in value or _is_sweep_function(value)


def _parsed_path(override: str) -> Optional[str]:
    """The value of `key=value` as Hydra reads it (quotes and escapes resolved, e.g. a path with
    spaces); None for a sweep over several values."""
    from hydra.core.override_parser.overrides_parser import (
        OverridesParser,
    )  # its grammar: only when a path is given

    parsed = OverridesParser.create().parse_override(override)
    return None if parsed.is_sweep_override() else str(parsed.value())


def _given_base(value: Optional[str]) -> bool:
    return value not in (None, "null")


def shape_of_base(base: Optional[str]) -> Optional[dict]:
    """The model shape that `model.base=<base>` (the value as typed) gives, for FULL_SCALE_OVERRIDE;
    None without a base, or for an interpolation (resolved later) or a sweep (several bases): the
    config check compares those."""
    path = _parsed_path(f"model.base={base}") if _given_base(base) and "${" not in base else None
    if path is None:
        return None
    try:
        return base_shape(path)
    except CheckpointError as error:
        raise OverrideError(f"model.base={base}: {error}") from None


def with_full_scale(overrides: list[str]) -> tuple[list[str], Optional[dict]]:
    """`overrides` (`key=value` arguments, flags allowed) with `scale=full` after their last
    `model.base=` or `model=` when they give a base or a preset other than the demo's and choose no
    scale themselves; and the base's shape."""
    parsed = {key: value for _, key, value in filter(None, map(_split_override, overrides))}
    base, preset = _given_base(parsed.get("model.base")), parsed.get("model", DEMO_MODEL)
    if SCALE_GROUP in parsed or not (base or preset != DEMO_MODEL and not _is_sweep(preset)):
        return overrides, None
    # Among the overrides, not after a flag such as `--cfg job`, which would end Hydra's list of
    # them.
    last = max(i for i, arg in enumerate(overrides) if override_key(arg) in ("model.base", "model"))
    return (
        [*overrides[: last + 1], FULL_SCALE_OVERRIDE, *overrides[last + 1 :]],
        shape_of_base(parsed["model.base"]) if base else None,
    )


def _named_stages(value: str) -> list[str]:
    """The stages of `stage=<value>` (several for a sweep); an unknown one is an error."""
    names = value.split(",")
    for v in names:
        if v not in TARGETS:
            raise OverrideError(
                f"Unknown stage `stage={v}`. Valid stages, closest first: "
                f"{', '.join(closest_first(v, TARGETS))}."
            )
    return names


def _check_required(seen: dict[str, str], stages: set[str]) -> None:
    """Refuse a command line without a stage or a language, or with `langs=` where it does not
    belong (`seen`: the overrides' values by key; `stages`: those named)."""
    for required, choices in (
        ("stage", ", ".join(TARGETS)),
        ("lang", "an ISO 639-3 code such as nob"),
    ):
        if required not in seen and not (
            required == "lang" and ("langs" in seen or stages == {PLAN_TARGET})
        ):
            several = (
                " (stage=workflow and stage=status also take langs=[nob,nno] or langs=all)"
                if stages and stages <= set(WORKFLOW_TARGETS)
                else ""
            )
            raise OverrideError(
                f"Missing `{required}=`. Give one of: {choices}{several}. "
                "Example: python -m pipeline stage=clean lang=nob"
            )
    if "langs" in seen and not stages <= set(WORKFLOW_TARGETS):
        raise OverrideError(
            "`langs=` is for stage=workflow and stage=status; the other stages take one "
            "language (lang=nob), or sweep with -m lang=nob,nno."
        )
    if {"lang", "langs"} <= seen.keys():
        raise OverrideError(
            "Give either lang=<code> (one language) or langs=[...] (several), not both."
        )
    if "runs" in seen and stages != {COMPARE_TARGET}:
        raise OverrideError(
            "`runs=` is for stage=compare (the runs to compare); the other stages take one run: "
            "run=<name>."
        )


# Keys whose sweep runs one job per language or stage, each in its own folders already: they name no
# run.
_NOT_RUN_KEYS = ("stage", "lang", "langs")


def with_swept_run_names(argv: list[str], seen: dict[str, str]) -> list[str]:
    """`argv` of a multirun (`-m`) that sweeps other keys than the stage and the language: each job
    a run of its own, named from its swept values (`train.lr=0.0001` -> run `train.lr-0.0001`,
    pipeline/run_folders.py), so that the jobs never write the same folders. A `run=` given with
    such a sweep would name every job alike: refused."""
    if not any(arg in ("-m", "--multirun") for arg in argv):
        return argv
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    swept = {
        override.key_or_group
        for override in parser.parse_overrides([f"{key}={value}" for key, value in seen.items()])
        if override.is_sweep_override() and override.key_or_group not in _NOT_RUN_KEYS
    }
    if not swept - {"run"}:
        return argv
    if "run" in seen:
        raise OverrideError(
            f"`run={seen['run']}` with a sweep over {', '.join(sorted(swept - {'run'}))}: every "
            "job would be the same run and write the same folders. Leave `run=` out: a multirun "
            "names each job's run from its swept values (train.lr=0.0001 -> run train.lr-0.0001)."
        )
    named_by = [key for key in seen if key not in swept] + ["run", SCALE_GROUP]
    return [
        *argv,
        f"run=${{{SWEPT_RUN_RESOLVER}:}}",
        f"hydra.job.config.override_dirname.exclude_keys=[{','.join(named_by)}]",
    ]


def preflight(argv: list[str]) -> CommandLine:
    """Validate and normalise the override arguments; returns the argv to hand to Hydra and what the
    run needs."""
    if any(arg in _HELP_FLAGS for arg in argv):
        return CommandLine(argv=argv, help=True)
    hydra_help = "--hydra-help" in argv
    out, skip_next, seen, stages, languages = [], False, {}, set(), []
    for arg in argv:
        if skip_next:
            out.append(arg)
            skip_next = False
            continue
        if arg in _FLAGS_WITH_VALUE:
            skip_next = True
            out.append(arg)
            continue
        parsed = _split_override(arg)
        if parsed is None:
            out.append(arg)
            continue
        prefix, key, value = parsed
        seen[key] = value
        if key.startswith("hydra.") or prefix:
            out.append(arg)
            continue
        if key == "lang" and not _is_sweep_function(value):
            value = ",".join(resolve_language(v) for v in value.split(","))
            languages += value.split(",")
        elif key == "lang":
            languages = None  # a sweep function may pick any language
        elif key == "langs":
            codes = resolve_languages(value)
            value = f"[{','.join(codes)}]"
            if languages is not None:
                languages += codes
        elif key == "stage" and not _is_sweep_function(value):
            stages.update(_named_stages(value))
        elif key == "runs" and value == ALL_RUNS:
            value = f"[{ALL_RUNS}]"
        elif key not in _CONFIG_GROUPS:
            leaf = check_key(key)
            if leaf is not None:
                check_value(key, value, leaf)
        out.append(f"{key}={value}")
    out, shape = with_full_scale(with_swept_run_names(out, seen))
    if hydra_help and "lang" not in seen:
        # Hydra composes the config even for --hydra-help; any language will do
        out.append("lang=nob")
        languages = ["nob"]
    if not hydra_help:
        _check_required(seen, stages)
    return CommandLine(
        argv=out,
        languages=None if languages is None else tuple(dict.fromkeys(languages)),
        base_shape=shape,
    )
