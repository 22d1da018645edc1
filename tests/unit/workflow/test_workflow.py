"""stage=workflow without Slurm: the 75-language dry run, quoting of every value a job gets, the
checks on language codes, the side-effect-free marker check and the plan's grouping
(tests/slurm/test_workflow_slurm.py runs the workflow on a real Slurm)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Quote, QuotedString

from pipeline.config import STAGE_NAMES
from pipeline.contract import Stage, execute, is_current
from pipeline.languages import LANGUAGES, UnknownLanguageError
from pipeline.overrides import OverrideError, preflight
from pipeline.stages import RECIPE_STAGES, Step
from pipeline.work_folder import MARKER
from pipeline.workflow.arrays import Existing, dependency, plan
from pipeline.workflow.progress import DONE, NOT_STARTED, QUEUED, Cell, Task
from tests.conftest import run_cli

GRAPH_LINE = re.compile(r"^(\S+): stage=(\S+) array=(\S+) tasks=(\d+) after=(\S+)$", re.MULTILINE)
SCRIPT = re.compile(
    r"^#### (.+?) \(not written: workflow.dry_run=true\)\n(.*?)(?=^#### )", re.MULTILINE | re.DOTALL
)


def base_folder(path: Path) -> Path:
    """A base model as the command line reads it: a Llama config.json (no weights: nothing runs)."""
    path.mkdir()
    (path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64, '
        '"num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}',
        encoding="utf-8",
    )
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
    # On LUMI's settings, with a layout of 16 ranks: two nodes of eight GCDs for the training
    # stages.
    out = run_cli(
        "stage=workflow",
        "langs=all",
        "workflow.dry_run=true",
        f"model.base={base}",
        "cluster=lumi",
        "cluster.account=project_465000000",
        "parallel.tp=2",
        "parallel.pp=4",
        "parallel.dp=2",
        "workflow.signal_seconds=600",
        cwd=tmp_path,
    ).stdout

    hplt = [
        index for index, entry in enumerate(LANGUAGES.values()) if entry.get("in_hplt_v1_2", True)
    ]
    assert len(hplt) == 75
    eng = list(LANGUAGES).index("eng")
    graph = {
        name: (stage, expand(spec), int(tasks), after)
        for name, stage, spec, tasks, after in GRAPH_LINE.findall(out)
    }
    # One array per stage, in the recipe's order; the base's replay once, for English, which every
    # mix waits for
    assert list(graph) == list(RECIPE_STAGES) and [stage for stage, *_ in graph.values()] == list(
        RECIPE_STAGES
    )
    assert graph["replay"] == ("replay", [eng], 1, "-")
    assert graph["clean"] == ("clean", hplt, 75, "-")
    assert graph["mix"][1:] == (
        hplt,
        75,
        f"aftercorr:clean,afterok:clean_{eng},afterok:replay_{eng}",
    )
    for previous, stage in zip(
        STAGE_NAMES[1:], STAGE_NAMES[2:]
    ):  # task ids are the table's indices
        assert graph[stage] == (stage, hplt, 75, f"aftercorr:{previous}")

    scripts = scripts_by_stage(out)
    assert list(scripts) == list(RECIPE_STAGES)
    for stage, text in scripts.items():
        cases = dict(re.findall(r"^    (\d+)\) lang=(\w+) ;;$", text, re.MULTILINE))
        assert {int(i): code for i, code in cases.items()} == {
            i: list(LANGUAGES)[i] for i in graph[stage][1]
        }
        assert "#SBATCH --account=project_465000000\n" in text
        if stage in (
            "warmup",
            "pretrain",
        ):  # whole nodes; warned before the time limit, passes the signal on, requeues
            for line in (
                "#SBATCH --partition=standard-g\n",
                "#SBATCH --nodes=2\n",
                "#SBATCH --ntasks-per-node=8\n",
                "#SBATCH --gpus-per-node=8\n",
                "#SBATCH --cpus-per-task=7\n",
                "#SBATCH --signal=B:USR1@600\n",
                "#SBATCH --requeue\n",
                'trap \'kill -USR1 "$child"',
                "if [[ $status == 75 ]]",
                'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
                "cluster.executor=slurm",
            ):
                assert line in text, (stage, line)
        elif stage == "replay":  # one GCD, on LUMI's partition of shared nodes
            for line in (
                "#SBATCH --partition=small-g\n",
                "#SBATCH --ntasks=1\n",
                "#SBATCH --gpus-per-node=1\n",
                "#SBATCH --cpus-per-task=7\n",
                "cluster.executor=local workers=7",
            ):
                assert line in text, (stage, line)
        # one job on LUMI-C cores, datatrove running inside it (evaluate: a small model, on a CPU)
        else:
            for line in (
                "#SBATCH --partition=small\n",
                "#SBATCH --cpus-per-task=32\n",
                "cluster.executor=local workers=32",
            ):
                assert line in text, (stage, line)
            assert "--gpus-per-node" not in text and "--requeue" not in text
    # A dry run writes no script and no state (only Hydra's log of the command, as every command
    # does).
    assert not list((tmp_path / "work").rglob("*.sh")) and not list(
        (tmp_path / "work").rglob("state.json")
    )


def job_words(script: str) -> list[str]:
    """The job's command line, as bash builds it for the array task of `fao`."""
    command = re.search(r"^command=\(.*\)$", script, re.MULTILINE).group(0)
    return subprocess.run(
        ["bash", "-c", f'lang=fao\n{command}\nprintf "%s\\0" "${{command[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")[:-1]


def test_on_lumi_a_7b_base_fills_whole_nodes_and_is_scored_on_a_gpu(tmp_path):
    """cluster=lumi without a layout: the training stages take whole nodes of 8 GCDs (dp=8: a 7B
    model fits one GCD with its optimizer state shared by 8 ranks), replay and evaluate one GCD each
    on small-g; the jobs carry the user's overrides and the workflow's own settings, nothing else."""
    base = tmp_path / "mistral-7b"
    base.mkdir()
    (base / "config.json").write_text(
        '{"architectures": ["MistralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096, '
        '"num_hidden_layers": 32, '
        '"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, '
        '"max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": false}',
        encoding="utf-8",
    )
    user = [
        f"model.base={base}",
        "cluster=lumi",
        "cluster.account=project_465000000",
        "train.lr=1e-4",
    ]
    out = run_cli(
        "stage=workflow", "langs=all", "workflow.dry_run=true", *user, cwd=tmp_path
    ).stdout
    assert (
        "Training layout: parallel.tp=1 parallel.pp=1 parallel.dp=8, which fills whole nodes of 8 "
        "GPUs" in out
    )
    scripts = scripts_by_stage(out)
    for stage in ("warmup", "pretrain"):
        for line in (
            "#SBATCH --partition=standard-g\n",
            "#SBATCH --nodes=1\n",
            "#SBATCH --ntasks-per-node=8\n",
            "#SBATCH --gpus-per-node=8\n",
        ):
            assert line in scripts[stage], (stage, line)
    for stage in ("replay", "evaluate"):
        for line in (
            "#SBATCH --partition=small-g\n",
            "#SBATCH --ntasks=1\n",
            "#SBATCH --gpus-per-node=1\n",
        ):
            assert line in scripts[stage], (stage, line)
    work = f"work_dir={tmp_path / 'work'}"
    for stage, text in scripts.items():
        words = job_words(text)
        assert words[:5] == [sys.executable, "-m", "pipeline", f"stage={stage}", "lang=fao"]
        own = (
            ["parallel.tp=1", "parallel.pp=1", "parallel.dp=8", "cluster.executor=slurm"]
            if stage in ("warmup", "pretrain")
            else ["cluster.executor=local", f"workers={7 if 'small-g' in text else 32}"]
        )
        assert words[5:] == [*user, work, *own], stage  # no override the user did not give
    # A layout on the command line is the user's: the jobs take it as given.
    out = run_cli(
        "stage=workflow", "lang=fao", "workflow.dry_run=true", *user, "parallel.tp=8", cwd=tmp_path
    ).stdout
    assert (
        "Training layout" not in out
        and "#SBATCH --ntasks-per-node=8\n" in scripts_by_stage(out)["pretrain"]
    )
    assert "parallel.tp=8" in job_words(
        scripts_by_stage(out)["pretrain"]
    ) and "parallel.dp=8" not in job_words(scripts_by_stage(out)["pretrain"])


def test_paths_with_spaces_and_quotes_reach_the_job_unchanged(tmp_path):
    work = tmp_path / "work dir 'single' \"double\" $HOME `x`"
    base = base_folder(tmp_path / "base model 'x'")
    # As a user gives such paths to Hydra: quoted (in the shell, e.g. 'model.base="/models/base
    # model"').
    base_override = f"model.base={QuotedString(text=str(base), quote=Quote.double).with_quotes()}"
    out = run_cli(
        "stage=workflow",
        "langs=[fao,isl]",
        "workflow.dry_run=true",
        base_override,
        "mix.max_epochs=2",
        f"work_dir={QuotedString(text=str(work), quote=Quote.single).with_quotes()}",
        cwd=tmp_path,
    ).stdout
    scripts = scripts_by_stage(out)
    for stage, text in scripts.items():
        path = tmp_path / f"{stage}.sh"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)  # valid shell

    # The job's argv as bash builds it, for the array task of fao: the user's overrides and the
    # workflow's own (the job's command line check merges the base's shape over the preset, as this
    # command's did).
    printed = job_words(scripts["clean"])
    work_override = next(arg for arg in printed if arg.startswith("work_dir="))
    assert printed == [
        sys.executable,
        "-m",
        "pipeline",
        "stage=clean",
        "lang=fao",
        base_override,
        "mix.max_epochs=2",
        work_override,
        "cluster.executor=local",
        "workers=1",
    ]
    command = re.search(r"^command=\(.*\)$", scripts["clean"], re.MULTILINE).group(0)
    parser = OverridesParser.create()
    assert parser.parse_override(work_override).value() == str(work)  # what the job's Hydra reads
    assert parser.parse_override(base_override).value() == str(base)
    assert (
        shlex.split(command[len("command=(") : -1])[4] == "lang=${lang}"
    )  # the only word the shell expands


def test_codes_with_shell_metacharacters_and_unknown_codes_are_rejected(tmp_path):
    result = run_cli(
        "stage=workflow",
        "langs=[fao,isl;touch pwned]",
        "workflow.dry_run=true",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    assert (
        "Unknown language `lang=isl;touch pwned`. Closest known codes: isl (Icelandic)"
        in result.stderr
    )
    for typed in ("langs=$(touch pwned)", "langs=[fao,xx y]", "lang=`id`"):
        with pytest.raises(UnknownLanguageError, match="Closest known codes"):
            preflight(["stage=workflow", typed])
    assert (
        preflight(["stage=status", "langs=[nb, fao,nob]"]).argv[1] == "langs=[nob,fao]"
    )  # aliases, table order
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
    run: str = "default"
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
    assert (
        sorted(str(p) for p in tmp_path.rglob("*")) == before
    )  # no invalidation, no partial folder
    assert (tmp_path / "nob" / "second" / MARKER).exists()


def toy_steps(
    languages: list[str],
    stages: tuple[str, ...],
    base: str = "b",
    base_stages: tuple[str, ...] = (),
) -> list[Step]:
    """Steps as pipeline.stages.recipe makes them: the base language's `base_stages`, then each
    language's `stages` in a chain whose second stage also waits for every base step."""

    def cfg(code):
        return SimpleNamespace(
            lang=SimpleNamespace(code=code), model=SimpleNamespace(base_lang=base)
        )

    shared = tuple((base, stage) for stage in base_stages)
    steps = [Step(stage, cfg(base)) for stage in base_stages]
    for code in languages:
        for number, stage in enumerate(stages):
            steps.append(
                Step(
                    stage,
                    cfg(code),
                    (code, stages[number - 1]) if number else None,
                    shared if number == 1 else (),
                )
            )
    return steps


def test_plan_waits_for_queued_tasks_and_groups_languages_by_what_they_wait_for():
    stages = ("a", "b", "c")
    queued = Cell(QUEUED, Task("7", 1, Path("log")))
    cells = {
        ("x", "a"): Cell(DONE),
        ("x", "b"): Cell(DONE),
        ("x", "c"): Cell(NOT_STARTED),  # only c
        ("y", "a"): Cell(DONE),
        ("y", "b"): queued,
        ("y", "c"): Cell(NOT_STARTED),  # c after job 7
        ("z", "a"): Cell(NOT_STARTED),
        ("z", "b"): Cell(DONE),
        ("z", "c"): Cell(DONE),  # all: a reruns
        ("w", "a"): Cell(DONE),
        ("w", "b"): Cell(DONE),
        ("w", "c"): Cell(DONE),
    }  # nothing
    arrays = plan(toy_steps(["x", "y", "z", "w"], stages), cells, {})
    summary = [
        (
            array.name,
            array.languages,
            array.after
            if isinstance(array.after, Existing)
            else getattr(array.after, "name", None),
        )
        for array in arrays
    ]
    assert summary == [
        ("c.1", ["x"], None),
        ("c.2", ["y"], Existing("7")),
        ("a", ["z"], None),
        ("b", ["z"], "a"),
        ("c.3", ["z"], "b"),
    ]


def test_the_base_languages_steps_run_once_and_every_language_waits_for_them():
    steps = toy_steps(["x", "y"], ("a", "b", "c"), base_stages=("a", "r"))
    index = {"b": 9, "x": 1, "y": 2}
    cells = {step.key: Cell(NOT_STARTED) for step in steps}
    arrays = plan(steps, cells, index)
    graph = {
        array.name: (array.languages, dependency(array, {id(a): a.name for a in arrays}))
        for array in arrays
    }
    # The base language's `a` joins the languages' array; its `r` is an array of one task; each `b`
    # waits task by task for its own `a` and for the two base tasks.
    assert graph == {
        "a": (["b", "x", "y"], None),
        "r": (["b"], None),
        "b": (["x", "y"], "aftercorr:a,afterok:a_9,afterok:r_9"),
        "c": (["x", "y"], "aftercorr:b"),
    }
    # With the base steps done, nothing waits for them; one of them queued: every `b` waits for that
    # task.
    done = {
        **cells,
        ("b", "a"): Cell(DONE),
        ("b", "r"): Cell(QUEUED, Task("5", 9, Path("log"))),
        ("x", "a"): Cell(DONE),
        ("y", "a"): Cell(DONE),
    }
    arrays = plan(steps, done, index)
    assert [
        (array.name, dependency(array, {id(a): a.name for a in arrays})) for array in arrays
    ] == [("b", "afterok:5_9"), ("c", "aftercorr:b")]
    # A base step that runs again reruns every language's steps after it, done or not.
    rerun = {key: Cell(DONE) for key in cells} | {("b", "r"): Cell(NOT_STARTED)}
    assert [(array.name, array.languages) for array in plan(steps, rerun, index)] == [
        ("r", ["b"]),
        ("b", ["x", "y"]),
        ("c", ["x", "y"]),
    ]


def test_status_table_lists_failures_with_their_logs():
    from pipeline.workflow.progress import FAILED, RUNNING
    from pipeline.slurm import TaskState
    from pipeline.workflow.progress import table

    log = Path("/work/.workflow/logs/mix_12_29.log")
    steps = toy_steps(["isl", "fao"], ("clean", "mix"), base="eng", base_stages=("clean", "replay"))
    cells = {
        ("eng", "clean"): Cell(DONE),
        ("eng", "replay"): Cell(DONE),
        ("isl", "clean"): Cell(DONE),
        ("isl", "mix"): Cell(FAILED, Task("12", 29, log), TaskState("FAILED")),
        ("fao", "clean"): Cell(DONE),
        ("fao", "mix"): Cell(RUNNING),
    }
    text = table(steps, cells, Path("/work"))
    rows = {
        line.split()[0]: line.split("  ")
        for line in text.splitlines()
        if line[:3] in ("eng", "isl", "fao")
    }
    cells_of = {
        code: [cell.strip() for cell in row[1:] if cell.strip()] for code, row in rows.items()
    }
    assert cells_of == {
        "eng": ["done", "done"],
        "isl": ["done", "FAILED"],
        "fao": ["done", "running"],
    }
    assert "eng English (base)" in text and text.index("eng English") < text.index("isl")
    assert re.search(r"^language\s+clean\s+replay\s+mix$", text, re.MULTILINE)
    assert re.search(r"^done\s+3/3\s+1/1\s+0/2$", text, re.MULTILINE)
    assert f"  isl mix: {log} (Slurm: FAILED)" in text


def test_a_training_task_that_stops_right_after_each_start_is_requeued_a_bounded_number_of_times(
    tmp_path,
):
    """The ranks' script (pretrain's, as stage=workflow writes it) run by bash as Slurm would run
    it: the stage stops with 75 each time at once; `scontrol` here only records the requeue the
    script asks for."""
    from omegaconf import OmegaConf

    from pipeline.config import PipelineConfig
    from pipeline.contract import ON_RANKS
    from pipeline.workflow.jobs import render_script

    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(PipelineConfig),
            {
                "stage": "workflow",
                "work_dir": str(tmp_path / "work"),
                "workflow": {"max_requeues": 2},
            },
        )
    )
    stage_ran = tmp_path / "stage_ran"
    script = render_script(
        "pretrain",
        ON_RANKS,
        [],
        {3: "fao"},
        cfg,
        ["bash", "-c", f"echo ran >> {stage_ran}; exit 75"],
        tmp_path / "requeues",
    )
    (tmp_path / "job.sh").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "requeued"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_ARRAY_JOB_ID": "41",
        "SLURM_ARRAY_TASK_ID": "3",
    }

    def start() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True
        )

    for _ in range(2):  # requeued while the quick stops stay within workflow.max_requeues
        assert start().returncode == 75
    third = start()
    assert third.returncode == 1 and "not requeued again (workflow.max_requeues=2)" in third.stderr
    assert (tmp_path / "requeued").read_text().splitlines() == ["requeue 41_3", "requeue 41_3"]
    assert stage_ran.read_text().count("ran") == 3
    # A run that trained a while (longer than the signal's warning) starts the count again.
    (tmp_path / "requeues" / "pretrain_41_3").write_text("7\n")
    patient = script.replace("started=$SECONDS", "started=$(( SECONDS - 10000 ))")
    (tmp_path / "job.sh").write_text(patient)
    assert (
        start().returncode == 75 and (tmp_path / "requeues" / "pretrain_41_3").read_text() == "0\n"
    )


def test_the_recipe_is_one_definition_for_stage_all_and_the_workflow(tmp_path):
    """pipeline.stages.recipe: with a base, English's clean and the base's replay once, before every
    language's mix; without one (the demo), the demo's base first, which the languages then start
    from."""
    from omegaconf import OmegaConf

    from pipeline.config import PipelineConfig
    from pipeline.languages import language_config
    from pipeline.stages import demo_base_folder, recipe

    def config(code, **changes):
        return OmegaConf.to_object(
            OmegaConf.merge(
                OmegaConf.structured(PipelineConfig),
                {"lang": OmegaConf.structured(language_config(code, LANGUAGES[code]))},
                {"stage": "all", "work_dir": str(tmp_path / "work"), **changes},
            )
        )

    with_base = {
        "model": {"base": str(tmp_path / "base")},
        "replay": {"tokens": 1000},
        "clean": {"heldout_sources": ["later_*"]},
    }
    steps = recipe({"nob": config("nob", **with_base), "fao": config("fao", **with_base)})
    assert [step.key for step in steps] == [
        ("eng", "clean"),
        ("eng", "replay"),
        *((code, stage) for code in ("nob", "fao") for stage in STAGE_NAMES),
    ]
    mix = next(step for step in steps if step.key == ("fao", "mix"))
    assert mix.needs == (("fao", "clean"), ("eng", "clean"), ("eng", "replay"))
    assert all(step.cfg.lang.code == step.lang for step in steps)
    # The command line's held-out sources are the named languages' files: English, which the run
    # does not name, is cleaned with its table's (and gets scripts of its own in a workflow); where
    # the run names it, with the run's.
    assert [step.for_base for step in steps[:3]] == [True, True, False]
    assert steps[0].cfg.clean.heldout_sources is None and mix.cfg.clean.heldout_sources == [
        "later_*"
    ]
    named = recipe({"eng": config("eng", **with_base), "nob": config("nob", **with_base)})
    assert [step.key for step in named[:3]] == [("eng", "clean"), ("eng", "replay"), ("eng", "mix")]
    assert not any(step.for_base for step in named) and named[0].cfg.clean.heldout_sources == [
        "later_*"
    ]
    # No replay asked for: none; English's text missing from the raw folder: the mix goes on without
    # it.
    no_replay = recipe(
        {"nob": config("nob", model={"base": str(tmp_path / "base")}, replay={"tokens": 0})}
    )
    assert [step.key for step in no_replay][:2] == [("eng", "clean"), ("nob", "clean")]
    (tmp_path / "raw" / "nob").mkdir(parents=True)
    alone = recipe({"nob": config("nob", raw_dir=str(tmp_path / "raw"), **with_base)})
    assert [step.key for step in alone][:2] == [("eng", "replay"), ("nob", "clean")]

    demo = recipe({"nob": config("nob")})
    assert [step.key for step in demo] == [
        *(("eng", stage) for stage in ("clean", "mix", "tokenizer", "pack", "pretrain")),
        *(("nob", stage) for stage in STAGE_NAMES),
    ]
    assert demo[4].cfg.init == "scratch" and demo[4].cfg.train == demo[4].cfg.demo_base.train
    assert all(step.cfg.model.base == str(demo_base_folder(step.cfg)) for step in demo[5:])
    assert [step.key for step in recipe({"eng": config("eng")})] == [step.key for step in demo[:5]]


def test_the_base_languages_jobs_take_no_setting_of_the_named_languages_text(tmp_path):
    base = base_folder(tmp_path / "base")
    out = run_cli(
        "stage=workflow",
        "langs=[swa,fao]",
        "workflow.dry_run=true",
        f"model.base={base}",
        "clean.heldout_sources=[later_*]",
        cwd=tmp_path,
    ).stdout
    graph = {
        name: (stage, expand(spec), after)
        for name, stage, spec, _, after in GRAPH_LINE.findall(out)
    }
    eng = list(LANGUAGES).index("eng")
    assert graph["clean.base"] == ("clean", [eng], "-") and graph["replay.base"] == (
        "replay",
        [eng],
        "-",
    )
    assert graph["clean"][1] == [list(LANGUAGES).index("swa"), list(LANGUAGES).index("fao")]
    assert graph["mix"][2] == f"aftercorr:clean,afterok:clean.base_{eng},afterok:replay.base_{eng}"
    scripts = {
        Path(path).name.rsplit("-", 2)[0]: text for path, text in SCRIPT.findall(out)
    }  # <stage>[-base]-<time>
    assert "clean.heldout_sources=[later_*]" not in job_words(scripts["clean-base"])
    assert "clean.heldout_sources=[later_*]" in job_words(scripts["clean"])


def test_cfg_job_after_model_base_and_unused_sections_refuse_nothing(tmp_path):
    base = base_folder(tmp_path / "base")
    shown = run_cli(
        "stage=clean", "lang=nob", f"model.base={base}", "--cfg", "job", cwd=tmp_path
    ).stdout
    assert (
        "replay:\n  tokens: 6000000" in shown
    )  # the base's defaults, merged although --cfg came after it
    # The demo's base section is not used with model.base: its batch (8, not a multiple of dp=3)
    # refuses nothing.
    shown = run_cli(
        "stage=pretrain",
        "lang=nob",
        f"model.base={base}",
        "parallel.dp=3",
        "train.global_batch_size=3",
        "warmup.train.global_batch_size=3",
        "--cfg",
        "job",
        cwd=tmp_path,
    ).stdout
    assert "dp: 3" in shown
    refused = run_cli(
        "stage=pretrain",
        "lang=nob",
        "parallel.dp=3",
        *(
            f"{section}.{key}={value}"
            for section in ("train", "warmup.train")
            for key, value in (("global_batch_size", 3), ("micro_batch_size", 1))
        ),
        cwd=tmp_path,
        check=False,
    )  # without model.base the demo's base is made: its section is checked
    assert refused.returncode == 1 and "demo_base.train.global_batch_size" in refused.stderr


def test_a_workflow_of_some_stages_submits_those_only(tmp_path):
    """`workflow.stages=[pretrain]`: the stages before it are not the workflow's to run or watch
    (their outputs are there, or the task fails saying which is missing)."""
    base = base_folder(tmp_path / "base")
    out = run_cli(
        "stage=workflow",
        "langs=[nob,fao]",
        "workflow.stages=[pretrain]",
        "workflow.dry_run=true",
        f"model.base={base}",
        cwd=tmp_path,
    ).stdout
    graph = {
        name: (stage, tasks, after) for name, stage, _, tasks, after in GRAPH_LINE.findall(out)
    }
    assert graph == {"pretrain": ("pretrain", "2", "-")}
