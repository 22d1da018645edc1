"""The README's test command is what CI runs."""

from tests.conftest import REPO


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if "pytest" in line)
    assert command in readme
