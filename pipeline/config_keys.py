"""Dotted keys over a config as plain data (nested dicts and lists): `train.steps`,
`mix.sources.0.path`.

A pattern matches a key segment by segment, `*` matching any one segment (`mix.sources.*.path`). The
stage contract uses them for the keys a stage leaves out of its hash and for the keys that may
change while an interrupted run is continued.
"""

from __future__ import annotations

from typing import Any, Iterable

_MISSING = "(not set)"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, 2]}} -> {"a.b.0": 1, "a.b.1": 2}; an empty dict or list is a value of its
    own."""
    if isinstance(tree, dict) and tree:
        items = tree.items()
    elif isinstance(tree, list) and tree:
        items = enumerate(tree)
    else:
        return {prefix: tree} if prefix else {}
    flat = {}
    for key, value in items:
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def matches(key: str, pattern: str) -> bool:
    """Whether `key` is `pattern` or lies inside it (`train` matches `train.lr`)."""
    parts, wanted = key.split("."), pattern.split(".")
    return len(parts) >= len(wanted) and all(w in ("*", p) for p, w in zip(parts, wanted))


def matches_any(key: str, patterns: Iterable[str]) -> bool:
    return any(matches(key, pattern) for pattern in patterns)


def differences(old: Any, new: Any) -> dict[str, tuple[Any, Any]]:
    """Key -> (old value, new value) for every key whose value differs, added or removed."""
    before, after = flatten(old), flatten(new)
    return {
        key: (before.get(key, _MISSING), after.get(key, _MISSING))
        for key in sorted(set(before) | set(after))
        if before.get(key, _MISSING) != after.get(key, _MISSING)
    }


def drop(tree: Any, pattern: str) -> None:
    """Remove the keys that `pattern` names from `tree` (in place); names that are absent are
    ignored."""
    head, _, rest = pattern.partition(".")
    if isinstance(tree, dict):
        children = list(tree) if head == "*" else [head] if head in tree else []
    elif isinstance(tree, list):
        children = (
            range(len(tree))
            if head == "*"
            else [int(head)]
            if head.isdigit() and int(head) < len(tree)
            else []
        )
    else:
        return
    for child in reversed(list(children)):
        if rest:
            drop(tree[child], rest)
        else:
            del tree[child]
