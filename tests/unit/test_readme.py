"""The README stays honest: its test command is what CI runs, it stays short, it leads to every
docs/ page, and no link in the documentation points at a file or heading that does not exist."""

import re

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
# Markdown links `[text](target)`; images too. Targets with a scheme (https:, mailto:) are not
# checked.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def documentation() -> list:
    return [
        README,
        REPO / "BENCHMARKS.md",
        REPO / "data" / "README.md",
        *sorted(DOCS.rglob("*.md")),
    ]


def prose(path) -> str:
    """The file without its fenced code blocks, whose `#` lines are comments, not headings."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_ci_runs_the_readme_test_command():
    readme = README.read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if "pytest" in line)
    assert command in readme


def test_readme_is_at_most_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / target.split("#")[0]).resolve() for target in LINK.findall(prose(README))
    }
    pages = set(DOCS.rglob("*.md"))
    assert pages, "docs/ has no pages"
    assert {page.relative_to(REPO) for page in pages if page.resolve() not in linked} == set()


def test_relative_links_point_at_existing_files_and_headings():
    broken = []
    for page in documentation():
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif (
                fragment
                and file.suffix == ".md"
                and fragment not in {anchor(h) for h in HEADING.findall(prose(file))}
            ):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_every_module_path_named_in_the_docs_and_the_code_exists():
    """`pipeline/...py` in README.md, docs/ and the package's own docstrings and comments names a
    module that is there: a module that moved or was merged takes its mentions with it."""
    path = re.compile(r"(?<![\w/.])pipeline/[\w/]+\.py\b")
    texts = [README, *sorted(DOCS.rglob("*.md")), *sorted((REPO / "pipeline").rglob("*.py"))]
    missing = sorted(
        {
            f"{text.relative_to(REPO)}: {name}"
            for text in texts
            for name in path.findall(text.read_text(encoding="utf-8"))
            if not (REPO / name).is_file()
        }
    )
    assert missing == []


RESULTS = REPO / "bench" / "results"
# A path under bench/results/ in prose, code marks, links or commands.
RESULT_PATH = re.compile(r"bench/results/[^\s`'\"()\[\]]*")


def test_bench_results_keeps_one_cited_file_per_result_and_the_docs_name_only_those():
    """bench/results/ keeps compact files (`<experiment>_<date>.json` or `.md`, a `.png` beside a
    JSON), each cited by BENCHMARKS.md; every `bench/results/<file>` that the docs or bench/ name
    exists. A path into a folder there (`bench/results/warm_start/`) is a benchmark's raw output,
    which git ignores: named as where a script writes, never linked."""
    problems, cited = [], set()
    for text_file in [*documentation(), *sorted((REPO / "bench").glob("*.py"))]:
        text = text_file.read_text(encoding="utf-8")
        linked = {
            (text_file.parent / target.split("#")[0]).resolve() for target in LINK.findall(text)
        }
        for name in {match.split("#")[0].rstrip(".,;:") for match in RESULT_PATH.findall(text)}:
            relative = name.removeprefix("bench/results/")
            if not relative or "<" in relative or "*" in relative:
                continue
            path = RESULTS / relative
            if "/" in relative or "." not in relative:  # a raw output folder, or a file in one
                if path.resolve() in linked:
                    problems.append(f"{text_file.relative_to(REPO)} links raw output {name}")
            elif not path.is_file():
                problems.append(f"{text_file.relative_to(REPO)} names {name}: no such file")
            elif text_file.name == "BENCHMARKS.md":
                cited.add(path.name)
    for path in sorted(p for p in RESULTS.iterdir() if p.is_file()):
        if path.suffix not in (".json", ".md", ".png"):
            problems.append(f"bench/results/{path.name}: not a compact result (.json, .md, .png)")
        elif path.name not in cited and not (
            path.suffix == ".png" and path.with_suffix(".json").name in cited
        ):
            problems.append(f"bench/results/{path.name}: not cited by BENCHMARKS.md")
    assert problems == []
