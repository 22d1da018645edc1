"""Checks the command line before Hydra composes it, so that mistakes fail with a useful message.

Hydra already rejects unknown keys; this adds what it cannot know: the closest valid keys, stage and
language names (closest first), and the language aliases (`lang=nb` becomes `lang=nob`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

from pipeline.choices import closest_first
from pipeline.config import PipelineConfig
from pipeline.languages import resolve_language, resolve_languages

# Hydra flags that take the next argument as their value.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}
_HELP_FLAGS = {"--help", "-h", "--hydra-help"}
_CONFIG_GROUPS = {"lang", "cluster", "mix", "model"}


class OverrideError(ValueError):
    pass


def _dataclass_of(tp) -> Optional[type]:
    """The dataclass inside a field type such as `Foo` or `Optional[Foo]`, if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def check_key(dotted: str) -> None:
    """Raise OverrideError if `dotted` is not a key of the pipeline config."""
    cls, walked, entry_next = PipelineConfig, [], False
    for part in dotted.split("."):
        if entry_next:  # an index or key into a list or dict of dataclasses (mix.sources.0.path)
            entry_next = False
            walked.append(part)
            continue
        if cls is None:
            return  # below a leaf or inside a free-form dict (cluster.sbatch_args): Hydra checks the rest
        types = typing.get_type_hints(cls)
        if part not in types:
            prefix = ".".join(walked)
            known = [f"{prefix}.{name}" if prefix else name for name in types]
            typed = f"{prefix}.{part}" if prefix else part
            suggestions = closest_first(typed, known)[:3]
            raise OverrideError(
                f"Unknown config key `{dotted}`. Did you mean: {', '.join(f'`{s}`' for s in suggestions)}? "
                "`python -m pipeline --cfg job stage=clean lang=nob` prints every key."
            )
        walked.append(part)
        cls = _dataclass_of(types[part])
        entry_next = cls is not None and typing.get_origin(types[part]) in (list, dict)


def _split_override(arg: str) -> Optional[tuple[str, str, str]]:
    """(prefix, key, value) of a `key=value` override; None for anything else."""
    if "=" not in arg or arg.startswith("-"):
        return None
    key, value = arg.split("=", 1)
    prefix = ""
    while key[:1] in "+~":
        prefix, key = prefix + key[0], key[1:]
    return prefix, key, value


def _is_sweep_function(value: str) -> bool:
    return any(value.startswith(f"{fn}(") for fn in ("choice", "range", "glob", "interval", "sort", "shuffle"))


def preflight(argv: list[str]) -> list[str]:
    """Validate and normalise the override arguments; returns the argv to hand to Hydra."""
    from pipeline.stages import PLAN_TARGET, TARGETS, WORKFLOW_TARGETS

    wants_help = any(arg in _HELP_FLAGS for arg in argv)
    out, skip_next, seen, stages = [], False, set(), set()
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
        seen.add(key)
        if key.startswith("hydra.") or prefix:
            out.append(arg)
            continue
        if key == "lang" and not _is_sweep_function(value):
            value = ",".join(resolve_language(v) for v in value.split(","))
        elif key == "langs":
            value = f"[{','.join(resolve_languages(value))}]"
        elif key == "stage" and not _is_sweep_function(value):
            stages.update(value.split(","))
            for v in value.split(","):
                if v not in TARGETS:
                    raise OverrideError(
                        f"Unknown stage `stage={v}`. Valid stages, closest first: {', '.join(closest_first(v, TARGETS))}."
                    )
        elif key not in _CONFIG_GROUPS:
            check_key(key)
        out.append(f"{key}={value}")
    if wants_help and "lang" not in seen:
        out.append("lang=nob")  # Hydra composes the config even for --help; any language will do
    if not wants_help:
        for required, choices in (("stage", ", ".join(TARGETS)), ("lang", "an ISO 639-3 code such as nob")):
            if required not in seen and not (required == "lang" and ("langs" in seen or stages == {PLAN_TARGET})):
                several = (" (stage=workflow and stage=status also take langs=[nob,nno] or langs=all)"
                           if stages and stages <= set(WORKFLOW_TARGETS) else "")
                raise OverrideError(
                    f"Missing `{required}=`. Give one of: {choices}{several}. "
                    "Example: python -m pipeline stage=clean lang=nob"
                )
        if "langs" in seen and not stages <= set(WORKFLOW_TARGETS):
            raise OverrideError("`langs=` is for stage=workflow and stage=status; the other stages take one "
                                "language (lang=nob), or sweep with -m lang=nob,nno.")
        if {"lang", "langs"} <= seen:
            raise OverrideError("Give either lang=<code> (one language) or langs=[...] (several), not both.")
    return out
