"""The import layering of `pipeline/` (docs: DESIGN's layer picture, README's layout): imports run
one way.

A unit is a subpackage (`pipeline/training/`) or a top-level module (`pipeline/config.py`); every
import of one unit by another counts, function-local ones included (a local import never dodges a
cycle), read from the source with `ast` (nothing is imported but the handles to the stages' outputs,
whose file names the last test looks for)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "pipeline"
# The ground floor imports nothing above it; the units above it, by name (a unit that no longer
# exists is no harm).
GROUND_FLOOR = (
    "kernels",
    "contract",
    "errors",
    "languages",
    "slurm",
    "cluster",
    "tensor_files",
    "stage_lock",
    "config_keys",
    "json_files",
    "commit_steps",
    "work_folder",
    "run_folders",
)
ABOVE_GROUND = (
    "__main__",
    "config_origins",
    "overrides",
    "config",
    "workflow",
    "stages",
    "stage_outputs",
    "training",
    "evaluation",
    "comparison",
    "parallel",
    "warmup",
    "packing",
    "mixing",
    "tokenization",
    "model",
    "corpus",
    "memory_fit",
)


def module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path) -> set[str]:
    """The dotted names of the modules `path` imports (`from a import b` may name module a.b)."""
    names, here = set(), module_name(path)
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def unit_graph() -> dict[str, set[str]]:
    """unit -> the other units it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = module_name(path)
        unit = parts[1] if len(parts) > 1 else "__init__"
        targets = graph.setdefault(unit, set())
        for name in imported_modules(path):
            dotted = name.split(".")
            if (
                dotted[0] == "pipeline"
                and len(dotted) > 1
                and dotted[1] != unit
                and ((PACKAGE / dotted[1]).is_dir() or (PACKAGE / f"{dotted[1]}.py").is_file())
            ):
                targets.add(dotted[1])
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for target in sorted(graph.get(unit, ())):
            if target not in index:
                visit(target)
                low[unit] = min(low[unit], low[target])
            elif target in stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_the_graph_holds_the_units_and_their_imports():
    graph = unit_graph()
    assert {"stages", "training", "model", "errors"} <= graph.keys()
    assert "errors" in graph["stages"] and "model" in graph["training"]


def test_relative_and_local_imports_are_read_too(tmp_path, monkeypatch):
    folder = tmp_path / "pipeline" / "alpha"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("from ..beta import thing\n", encoding="utf-8")
    (tmp_path / "pipeline" / "beta.py").write_text(
        "def f():\n    import pipeline.alpha.x\n", encoding="utf-8"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "pipeline")
    graph = unit_graph()
    assert graph["alpha"] == {"beta"} and graph["beta"] == {"alpha"}
    assert cycles(graph) == [["alpha", "beta"]]


def test_no_import_cycle_between_the_units_of_pipeline():
    assert cycles(unit_graph()) == []


# The adapters between the stage contract, the whole config and the libraries: the stages, the
# workflow and the command line. A library package takes plain values (paths, typed sections,
# numbers) instead (DESIGN); where an earlier stage's output is, is the work folder's layout
# (pipeline/work_folder.py), on the ground floor.
ADAPTERS = ("stages", "workflow", "__main__", "overrides", "config_origins", "config", "contract")


def test_library_packages_import_neither_the_contract_nor_the_whole_config():
    libraries, found = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = module_name(path)[1:]
        if not parts or parts[0] in ADAPTERS:
            continue
        libraries.append(".".join(parts))
        if imported_modules(path) & {"pipeline.contract", "pipeline.config"}:
            found.add(".".join(parts))
    assert found == set()
    assert {"training.run", "corpus.phases", "mixing.sources"} <= set(libraries)


def test_the_ground_floor_imports_nothing_above_it():
    graph = unit_graph()
    upward = {
        unit: sorted(graph[unit] & set(ABOVE_GROUND)) for unit in GROUND_FLOOR if unit in graph
    }
    assert upward and not any(upward.values()), upward


def test_the_command_line_and_the_data_stages_start_without_torch():
    """`python -m pipeline stage=clean|mix|tokenizer|pack` (and --help, stage=status) import no
    torch: three seconds of every such command on a CPU (pipeline/stages/__init__.py imports a
    stage's module when asked)."""
    code = (
        "import importlib, sys; import pipeline.__main__; "
        "[importlib.import_module(f'pipeline.stages.{name}') for name in ('clean', 'mix', "
        "'tokenizer', 'pack')]; "
        "print(sorted(name for name in sys.modules if name == 'torch' or "
        "name.startswith('torch.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout[-2000:]


# The stages are the only adapter layer (DESIGN, the layers): a stage module reads the earlier
# stages' outputs through the typed handles of pipeline/stage_outputs.py and calls its libraries
# with plain values; what it does itself is wiring, so a few names of the package are all it needs.
STAGE_MODULES = PACKAGE / "stages"
MOST_NAMES = 12


def names_from_the_package(source: str) -> list[str]:
    """The names a module imports from `pipeline`: each of `from pipeline.x import a, b` (or a
    relative import), and each `import pipeline.x`; function-local imports too."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] == "pipeline"
        ):
            names += [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.split(".")[0] == "pipeline"]
    return names


def test_names_from_the_package_are_counted_one_by_one():
    source = (
        "from pipeline.a import b, c\nimport pipeline.d\nimport os\nfrom . import e\n"
        "def f():\n    from pipeline.g import h\n"
    )
    assert sorted(names_from_the_package(source)) == ["b", "c", "e", "h", "pipeline.d"]


def test_every_stage_module_imports_at_most_12_names_from_the_package():
    counts = {
        path.name: len(names_from_the_package(path.read_text(encoding="utf-8")))
        for path in sorted(STAGE_MODULES.glob("*.py"))
    }
    assert {"clean.py", "evaluate.py", "tokenizer.py"} <= counts.keys()
    over = {name: count for name, count in counts.items() if count > MOST_NAMES}
    assert over == {}, f"stage modules over {MOST_NAMES} names of the package: {over}"


def stage_output_names() -> dict[str, set[str]]:
    """Each stage -> the names of the files and folders that its handle (pipeline/stage_outputs.py)
    knows."""
    from pipeline.stage_outputs import STAGE_OUTPUTS, StageOutput
    from pipeline.work_folder import OutputFile

    names = {}
    for handle in STAGE_OUTPUTS:
        sample = handle(Path("output"))
        values = [
            getattr(sample, field)
            for field, member in inspect.getmembers(handle)
            if isinstance(member, property) and not hasattr(StageOutput, field)
        ]
        names[handle.stage] = {
            (value.path if isinstance(value, OutputFile) else value).name
            for value in values
            if isinstance(value, (Path, OutputFile))
        }
    return names


def spelt_output_names(source: str, names: set[str]) -> set[str]:
    """The names among `names` that `source` spells as a string outside docstrings: a file name
    anywhere (`"plan.json"`), a folder name in a path join (`folder / "hf"`); a folder name alone
    may be a word of another kind (`"train"`)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    joined = {
        id(node.right)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value in names
        and (Path(node.value).suffix or id(node) in joined)
    }


def test_spelt_names_are_file_names_and_joined_folder_names():
    source = (
        '"""Reads plan.json."""\nx = run.input("mix") / "plan.json"\ny = folder / "hf"\nz = "hf"\n'
        'w = {"packed.json": 1}\n'
    )
    assert spelt_output_names(source, {"plan.json", "hf", "packed.json", "report.md"}) == {
        "plan.json",
        "hf",
        "packed.json",
    }


def test_no_stage_module_spells_another_stages_output_names():
    """`run.read_input(run.output(MixOutput).plan)`, not `run.input("mix") / "plan.json"`: the names
    are written once, where the handles gather them."""
    outputs = stage_output_names()
    assert (
        outputs["mix"] >= {"plan.json"}
        and outputs["pack"] >= {"packed.json"}
        and outputs["pretrain"] >= {"hf"}
    )
    found = {}
    for path in sorted(STAGE_MODULES.glob("*.py")):
        own = outputs.get(path.stem, set())
        others = (
            set().union(*(names for stage, names in outputs.items() if stage != path.stem)) - own
        )
        spelt = spelt_output_names(path.read_text(encoding="utf-8"), others)
        if spelt:
            found[path.name] = sorted(spelt)
    assert found == {}, f"use the handles of pipeline/stage_outputs.py instead: {found}"
