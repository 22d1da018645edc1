"""Where the pretrain stage starts, as the stage contract sees it: the warmup stage's checkpoint
(`init=warmup`), the base model (`init=hf`), random weights (`init=scratch`), or the final training
state of another run (`init=continue:<run>`, pipeline/training/continuation.py), found through that
run's pretrain output (pipeline/run_folders.py: its folders)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from pipeline.contract import StageRun
from pipeline.errors import StageError
from pipeline.model.files import describe_pretrain_start
from pipeline.run_folders import continued_run, language_runs
from pipeline.stage_outputs import PretrainOutput, WarmupOutput
from pipeline.training.continuation import ContinuedRun, carry_over_problems
from pipeline.training.run import final_state, steps_behind_checkpoints


def _pretrain_of(cfg, run: str) -> PretrainOutput:
    return PretrainOutput.at(dataclasses.replace(cfg, run=run))


def _finished_pretrain(cfg, name: str) -> PretrainOutput:
    """The finished pretrain output of run `name` for cfg's language; fails naming the run, the
    runs that have one, and how to make it."""
    output = _pretrain_of(cfg, name)
    if output.marker is not None:
        return output
    lang = cfg.lang.code
    done = [
        run
        for run in language_runs(cfg.work_dir, lang, (PretrainOutput.stage,))
        if _pretrain_of(cfg, run).marker is not None
    ]
    raise StageError(
        f"pretrain {lang}: init={cfg.init}: run `{name}` has no finished pretrain for {lang} (no "
        f"{output.marker_file.name} in {output.folder}). Train it first: python -m pipeline "
        f"stage=pretrain lang={lang} run={name} with its own init= and train.* settings; or "
        "continue a run that has one: "
        f"{', '.join(f'init=continue:{run}' for run in done) or 'none has yet'}."
    )


def describe_start(cfg) -> dict:
    """pretrain's described inputs (Stage.describe_inputs): the base model's files (init=hf), or the
    run it continues, by its pretrain's config hash (retrained, it is another start)."""
    name = continued_run(cfg.init)
    if name is None:
        return describe_pretrain_start(cfg)
    marker = _finished_pretrain(cfg, name).marker
    return {"continued_from": {"run": name, "config_hash": marker["config_hash"]}}


def continued_for(run: StageRun) -> Optional[ContinuedRun]:
    """The run that `run` continues (init=continue:<run>), checked before any work: it kept its
    final training state, and that state carries over (the same model, data stream and pack)."""
    cfg = run.cfg
    name = continued_run(cfg.init)
    if name is None:
        return None
    output = _finished_pretrain(cfg, name)
    if final_state(output.folder) is None:
        raise StageError(
            f"pretrain {run.lang}: init={cfg.init}: run `{name}` kept no final training state "
            f"({output.final_state} is missing: it was trained with train.keep_final_state=false, "
            "or the folder was removed), so its optimizer and data position are gone. Start from "
            f"its weights with a fresh optimizer instead: init=hf model.base={output.export}; or "
            f"train run {name} again with train.keep_final_state=true."
        )
    source = ContinuedRun(name, output.folder, output.final_state, output.marker)
    problems = carry_over_problems(source, run.hashed_config, run.inputs["pack"]["config_hash"])
    if problems:
        raise StageError(
            f"pretrain {run.lang}: init={cfg.init} cannot carry over run `{name}`'s optimizer "
            f"state and data position: {'; '.join(problems)}. Run with run {name}'s values (its "
            f"settings are in {output.marker_file}), or start another way: init=hf "
            f"model.base={output.export}."
        )
    return source


def trained_start(run: StageRun, source: Optional[ContinuedRun]) -> Optional[tuple[Path, object]]:
    """The trained checkpoint pretrain starts from, opened: the warmup stage's (init=warmup) or the
    final model of the run it continues; None for the other starts."""
    if run.cfg.init == "warmup":
        checkpoint = run.output(WarmupOutput).checkpoint
        return checkpoint.path, run.read_input(checkpoint)
    if source is None:
        return None
    checkpoint = PretrainOutput(source.folder).checkpoint
    try:
        return checkpoint.path, checkpoint.read(checkpoint.path)
    except Exception as error:  # safetensors, JSON or a missing file: each fails its own way
        raise StageError(
            f"pretrain {run.lang}: the final model of run `{source.run}` ({checkpoint.path}) "
            f"cannot be read ({error}). Train run {source.run} again."
        ) from None


def resume_problems(partial: Path, cfg) -> list[str]:
    """Why an interrupted pretrain run in `partial` cannot continue with cfg's step budget (a
    continued run ends at the step it started from plus its own steps)."""
    name = continued_run(cfg.init)
    start = 0 if name is None else _finished_pretrain(cfg, name).marker["metrics"]["steps"]
    steps = cfg.train.steps
    return steps_behind_checkpoints(partial, None if steps is None else start + steps)
