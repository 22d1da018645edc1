"""No function of `pipeline/` is longer than 80 lines (DESIGN's style anchors: a function reads on one
screen), counted from its `def` to its last line as formatted (`ruff format`, 100 columns), its
docstring included; Triton kernels too, whose helpers `@triton.jit` inlines."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGE = REPO / "pipeline"
MOST_LINES = 80


def function_lengths(source: str) -> list[tuple[str, int]]:
    """Each function's (and method's, and nested function's) name and lines, def to end."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def test_lines_are_counted_from_def_to_the_last_line():
    source = "@decorator\ndef f(\n    a,\n):\n    '''Doc.'''\n    return a\n\n\nx = 1\n"
    assert function_lengths(source) == [("f", 5)]


def test_no_function_is_over_80_lines():
    over = {
        f"{path.relative_to(REPO)}:{name}": lines
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, lines in function_lengths(path.read_text(encoding="utf-8"))
        if lines > MOST_LINES
    }
    assert len(list(PACKAGE.rglob("*.py"))) > 50
    assert over == {}, f"functions over {MOST_LINES} lines: {over}"
