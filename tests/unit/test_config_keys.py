"""Dotted config keys: flattening, differences, patterns with `*`, dropping."""

from __future__ import annotations

from pipeline.config_keys import differences, drop, flatten, matches_any


def test_flatten_and_differences_name_every_changed_leaf():
    old = {"train": {"steps": 8, "lr": 1e-3}, "mix": {"sources": [{"path": "a", "max": 4}]}}
    new = {
        "train": {"steps": 10, "lr": 1e-3},
        "mix": {"sources": [{"path": "b", "max": 4}, {"path": "c"}]},
    }
    assert flatten(old) == {
        "train.steps": 8,
        "train.lr": 1e-3,
        "mix.sources.0.path": "a",
        "mix.sources.0.max": 4,
    }
    assert differences(old, new) == {
        "mix.sources.0.path": ("a", "b"),
        "mix.sources.1.path": ("(not set)", "c"),
        "train.steps": (8, 10),
    }


def test_patterns_match_segments_and_drop_removes_them():
    assert matches_any("mix.sources.3.path", ["mix.sources.*.path"])
    assert matches_any("train.steps", ["train"]) and not matches_any("train.steps", ["train.lr"])
    tree = {
        "mix": {"sources": [{"path": "a", "max": 4}, {"path": "b"}]},
        "model": {"base": "x", "dim": 8},
    }
    drop(tree, "mix.sources.*.path")
    drop(tree, "model.base")
    drop(tree, "model.absent")
    assert tree == {"mix": {"sources": [{"max": 4}, {}]}, "model": {"dim": 8}}
