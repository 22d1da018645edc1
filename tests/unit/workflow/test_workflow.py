"""stage=workflow without Slurm: the 75-language dry run, quoting of every value a job gets, the checks on
language codes, the side-effect-free marker check and the plan's grouping (tests/slurm/test_workflow_slurm.py runs
the workflow on a real Slurm)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Quote, QuotedString

from pipeline.config import BASE_SHAPE_OVERRIDE, STAGE_NAMES
from pipeline.contract import MARKER, Stage, execute, is_current
from pipeline.languages import LANGUAGES, UnknownLanguageError
from pipeline.overrides import OverrideError, preflight
from pipeline.stages import STAGES
from pipeline.workflow.arrays import Existing, plan
from pipeline.workflow.progress import DONE, NOT_STARTED, QUEUED, Cell, Task
from tests.conftest import run_cli

GRAPH_LINE = re.compile(r"^(\S+): stage=(\S+) array=(\S+) tasks=(\d+) after=(\S+)$", re.MULTILINE)
SCRIPT = re.compile(r"^#### (.+?) \(not written: workflow.dry_run=true\)\n(.*?)(?=^#### )", re.MULTILINE | re.DOTALL)


def base_folder(path: Path) -> Path:
    """A base model as the command line reads it: a Llama config.json (no weights: nothing runs)."""
    path.mkdir()
    (path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}', encoding="utf-8")
    return path


def expand(spec: str) -> list[int]:
    """Slurm's --array value as indices: "0-2,5" -> [0, 1, 2, 5]."""
    indices = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        indices += range(int(first), int(last or first) + 1)
    return indices


def scripts_by_stage(out: str) -> dict[str, str]:
    return {Path(path).name.split("-")[0]: text for path, text in SCRIPT.findall(out)}


def test_all_languages_dry_run_is_one_array_per_stage_waiting_task_by_task(tmp_path):
    base = base_folder(tmp_path / "base")
    # On LUMI's settings, with a layout of 16 ranks: two nodes of eight GCDs for the training stages.
    out = run_cli("stage=workflow", "langs=all", "workflow.dry_run=true", f"model.base={base}", "cluster=lumi",
                  "cluster.account=project_465000000", "parallel.tp=2", "parallel.pp=4", "parallel.dp=2",
                  "workflow.signal_seconds=600", cwd=tmp_path).stdout

    hplt = [index for index, entry in enumerate(LANGUAGES.values()) if entry.get("in_hplt_v1_2", True)]
    assert len(hplt) == 75
    graph = GRAPH_LINE.findall(out)
    assert [stage for _, stage, *_ in graph] == list(STAGE_NAMES)  # one array per stage, in order
    previous = None
    for name, stage, spec, tasks, after in graph:
        assert expand(spec) == hplt and int(tasks) == 75  # task ids are the table's indices
        assert after == ("-" if previous is None else f"aftercorr:{previous}")
        previous = name

    scripts = scripts_by_stage(out)
    assert list(scripts) == list(STAGE_NAMES)
    for stage, text in scripts.items():
        cases = dict(re.findall(r"^    (\d+)\) lang=(\w+) ;;$", text, re.MULTILINE))
        assert {int(i): code for i, code in cases.items()} == {i: list(LANGUAGES)[i] for i in hplt}
        assert "#SBATCH --account=project_465000000\n" in text
        if STAGES[stage].gpu:  # whole nodes; warned before the time limit, passes the signal on, requeues on 75
            for line in ("#SBATCH --partition=standard-g\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n",
                         "#SBATCH --gpus-per-node=8\n", "#SBATCH --cpus-per-task=7\n", "#SBATCH --signal=B:USR1@600\n",
                         "#SBATCH --requeue\n", "trap 'kill -USR1 \"$child\"", "if [[ $status == 75 ]]",
                         'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"', "cluster.executor=slurm"):
                assert line in text, (stage, line)
        else:  # one job on LUMI-C cores, datatrove running inside it
            for line in ("#SBATCH --partition=small\n", "#SBATCH --cpus-per-task=32\n",
                         "cluster.executor=local workers=32"):
                assert line in text, (stage, line)
            assert "--gpus-per-node" not in text and "--requeue" not in text
    # A dry run writes no script and no state (only Hydra's log of the command, as every command does).
    assert not list((tmp_path / "work").rglob("*.sh")) and not list((tmp_path / "work").rglob("state.json"))


def test_paths_with_spaces_and_quotes_reach_the_job_unchanged(tmp_path):
    work = tmp_path / "work dir 'single' \"double\" $HOME `x`"
    base = base_folder(tmp_path / "base model 'x'")
    # As a user gives such paths to Hydra: quoted (in the shell, e.g. 'model.base="/models/base model"').
    base_override = f"model.base={QuotedString(text=str(base), quote=Quote.double).with_quotes()}"
    out = run_cli("stage=workflow", "langs=[fao,isl]", "workflow.dry_run=true", base_override, "mix.max_epochs=2",
                  f"work_dir={QuotedString(text=str(work), quote=Quote.single).with_quotes()}", cwd=tmp_path).stdout
    scripts = scripts_by_stage(out)
    for stage, text in scripts.items():
        path = tmp_path / f"{stage}.sh"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)  # valid shell

    # The job's argv as bash builds it, for the array task of fao.
    command = re.search(r"^command=\(.*\)$", scripts["clean"], re.MULTILINE).group(0)
    printed = subprocess.run(["bash", "-c", f'lang=fao\n{command}\nprintf "%s\\0" "${{command[@]}}"'],
                             capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    work_override = next(arg for arg in printed if arg.startswith("work_dir="))
    # The job merges the base's shape over the preset, as this command did.
    assert printed == [sys.executable, "-m", "pipeline", "stage=clean", "lang=fao", base_override,
                       "mix.max_epochs=2", BASE_SHAPE_OVERRIDE, work_override, "cluster.executor=local", "workers=1"]
    parser = OverridesParser.create()
    assert parser.parse_override(work_override).value() == str(work)  # what the job's Hydra reads
    assert parser.parse_override(base_override).value() == str(base)
    assert shlex.split(command[len("command=("):-1])[4] == "lang=${lang}"  # the only word the shell expands


def test_codes_with_shell_metacharacters_and_unknown_codes_are_rejected(tmp_path):
    result = run_cli("stage=workflow", "langs=[fao,isl;touch pwned]", "workflow.dry_run=true", cwd=tmp_path,
                     check=False)
    assert result.returncode == 2
    assert "Unknown language `lang=isl;touch pwned`. Closest known codes: isl (Icelandic)" in result.stderr
    for typed in ("langs=$(touch pwned)", "langs=[fao,xx y]", "lang=`id`"):
        with pytest.raises(UnknownLanguageError, match="Closest known codes"):
            preflight(["stage=workflow", typed])
    assert preflight(["stage=status", "langs=[nb, fao,nob]"]).argv[1] == "langs=[nob,fao]"  # aliases, table order
    with pytest.raises(OverrideError, match="`langs=` is for stage=workflow and stage=status"):
        preflight(["stage=clean", "langs=[fao]"])
    with pytest.raises(OverrideError, match="either lang=<code>"):
        preflight(["stage=workflow", "lang=fao", "langs=[isl]"])

    result = run_cli("stage=workflow", "langs=[fao]", cwd=tmp_path, check=False)
    assert result.returncode == 1 and "Invalid value for `model.base`: None" in result.stderr
    assert "python -m pipeline stage=all lang=nob" in result.stderr  # says how to get a base model
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("*.sh"))


@dataclass
class ToyLang:
    code: str = "nob"


@dataclass
class ToyConfig:
    work_dir: str
    lang: ToyLang = field(default_factory=ToyLang)
    size: int = 1
    resume: str = "auto"


def test_is_current_changes_nothing(tmp_path):
    first = Stage("first", run=lambda run: {"ok": 1}, config_sections=("size",))
    second = Stage("second", run=lambda run: {"ok": 2}, needs=("first",))
    cfg = ToyConfig(work_dir=str(tmp_path))
    assert not is_current(first, cfg) and not is_current(second, cfg)
    execute(first, cfg, downstream=("second",))
    execute(second, cfg)
    assert is_current(first, cfg) and is_current(second, cfg)

    changed = ToyConfig(work_dir=str(tmp_path), size=2)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert not is_current(first, changed)
    assert is_current(second, changed)  # its own inputs are unchanged until first runs again
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # no invalidation, no partial folder
    assert (tmp_path / "nob" / "second" / MARKER).exists()


def test_plan_waits_for_queued_tasks_and_groups_languages_by_what_they_wait_for():
    stages = ("a", "b", "c")
    queued = Cell(QUEUED, Task("7", 1, Path("log")))
    cells = {("x", "a"): Cell(DONE), ("x", "b"): Cell(DONE), ("x", "c"): Cell(NOT_STARTED),  # only c
             ("y", "a"): Cell(DONE), ("y", "b"): queued, ("y", "c"): Cell(NOT_STARTED),  # c after job 7
             ("z", "a"): Cell(NOT_STARTED), ("z", "b"): Cell(DONE), ("z", "c"): Cell(DONE),  # all: a reruns
             ("w", "a"): Cell(DONE), ("w", "b"): Cell(DONE), ("w", "c"): Cell(DONE)}  # nothing
    arrays = plan(["x", "y", "z", "w"], stages, cells)
    summary = [(array.name, array.languages, array.after if isinstance(array.after, Existing) else
                getattr(array.after, "name", None)) for array in arrays]
    assert summary == [("c.1", ["x"], None), ("c.2", ["y"], Existing("7")), ("a", ["z"], None),
                       ("b", ["z"], "a"), ("c.3", ["z"], "b")]


def test_status_table_lists_failures_with_their_logs():
    from pipeline.workflow.progress import FAILED, RUNNING
    from pipeline.slurm import TaskState
    from pipeline.workflow.progress import table

    log = Path("/work/.workflow/logs/mix_12_29.log")
    cells = {("isl", "clean"): Cell(DONE), ("isl", "mix"): Cell(FAILED, Task("12", 29, log), TaskState("FAILED")),
             ("fao", "clean"): Cell(DONE), ("fao", "mix"): Cell(RUNNING)}
    text = table(["isl", "fao"], ("clean", "mix"), cells, Path("/work"))
    rows = {line.split()[0]: line.split()[2:] for line in text.splitlines() if line[:3] in ("isl", "fao")}
    assert rows == {"isl": ["done", "FAILED"], "fao": ["done", "running"]}
    assert re.search(r"^done\s+2/2\s+0/2$", text, re.MULTILINE)
    assert f"  isl mix: {log} (Slurm: FAILED)" in text
