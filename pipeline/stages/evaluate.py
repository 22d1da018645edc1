"""Stage `evaluate`: bits per byte of the base, warm-started and final models on held-out text, per
held-out set.

Each model is scored with its own tokenizer (pipeline/evaluation/bits_per_byte.py), so the numbers
are comparable although the base model's tokenizer is not the language's. The models: the base model
(`model.base`, or the one the warmup stage recorded in its marker), `work/<lang>/warmup/hf` and
`work/<lang>/pretrain/hf`, each when it exists. The sets (pipeline/evaluation/texts.py): the clean
stage's held-out split (or `eval.path`), the sources the clean stage held out whole, and held-out
text of the base model's language; a trained model worse than the base on any of them is flagged.
Then the downstream tasks of `eval.tasks` and the two built from the held-out split
(`eval.heldout_tasks`), all read and checked before any model loads. Outputs: `report.json`,
`report.md` (opening with the base against the final model, the cost of the training and greedy
continuations), `bpb.png`, `training_curves.png` (loss and held-out BPB of warmup and pretrain
against training tokens) and the built tasks' files in `tasks/`.
"""

from __future__ import annotations

from functools import partial

from pipeline.contract import ON_CPU, ON_ONE_GPU, Stage, StageRun
from pipeline.errors import StageError
from pipeline.evaluation.models import ModelToScore
from pipeline.evaluation.run import eval_inputs, evaluate_models, scores_on_gpu
from pipeline.stage_outputs import TRAINED_OUTPUTS, CleanOutput, WarmupOutput


def base_model(cfg) -> str | None:
    """`model.base`, else the base the warmup stage recorded in its marker (in this work folder,
    wherever it is)."""
    if cfg.model.base is not None:
        return cfg.model.base
    return WarmupOutput.at(cfg).recorded_base(cfg.work_dir)


def needs_when(cfg) -> tuple[str, ...]:
    """The clean stage's held-out split is the text unless eval.path gives one. Without any model to
    score, the text does not matter: that is said first."""
    trained = [handle.at(cfg) for handle in TRAINED_OUTPUTS]
    if base_model(cfg) is None and not any(output.marker is not None for output in trained):
        raise StageError(
            f"evaluate {cfg.lang.code}: there is no model to evaluate: no model.base, and neither "
            f"{' nor '.join(str(output.marker_file) for output in trained)} exists. "
            f"Give model.base=<Hugging Face folder> or run the training stages first."
        )
    return ("clean",) if cfg.eval.path is None else ()


def describe_inputs(cfg) -> dict:
    """The base model's files, `eval.path`'s files and the text of the base model's language (the
    trained models and this language's clean output come through the contract)."""
    return eval_inputs(cfg, base_model(cfg))


def models(run: StageRun) -> list[ModelToScore]:
    """The models that exist, in the recipe's order: the base, then each trained one with what its
    stage scored and what its training took (its marker's metrics)."""
    found = []
    base = base_model(run.cfg)
    if base is not None:
        found.append(ModelToScore("base", base))
    for handle in TRAINED_OUTPUTS:
        output = run.output_if_done(handle)
        if output is not None:
            rows = output.heldout_rows
            # The rows are rescored only where there is a logged score to compare.
            rescored = rows.path.is_file() and output.logged_heldout_bpb is not None
            found.append(
                ModelToScore(
                    handle.stage,
                    str(output.export),
                    output.logged_heldout_bpb,
                    partial(run.read_input, rows) if rescored else None,
                    output.metrics if output.metrics.is_file() else None,
                    (output.marker or {}).get("metrics"),
                )
            )
    return found


def run_evaluate(run: StageRun) -> dict:
    clean = run.output_if_done(CleanOutput)
    return evaluate_models(
        run.work_dir,
        run.final_dir,
        models(run),
        run.cfg,
        clean.folder if clean is not None else None,
    )


def placement(cfg) -> str:
    """One GPU for models large enough to need one (the model's shape is the base's, which the
    trained ones keep)."""
    return ON_ONE_GPU if scores_on_gpu(cfg.model) else ON_CPU


STAGE = Stage(
    name="evaluate",
    run=run_evaluate,
    needs_when=needs_when,
    # clean's held-out sources are scored with eval.path too, when clean is done
    reads_if_done=("clean", "warmup", "pretrain"),
    hint="Or give eval.path=<file or folder of held-out text> instead of the clean stage's "
    "held-out split.",
    config_sections=("eval",),
    # The files of eval.path, eval.base_lang_path and eval.tasks enter the hash by their content
    # (describe_inputs), not by where they are.
    unhashed_keys=("eval.batch_size", "eval.path", "eval.base_lang_path", "eval.tasks.*.path"),
    describe_inputs=describe_inputs,
    placement=placement,
)
