"""Stage `replay`: text that `model.base` writes in its own language, for the mix's replay.

Run for the base's language (`lang=<model.base_lang>`, English by default); `stage=all` runs it,
after that language's clean stage, whenever `model.base` and `replay.tokens` are set (6M tokens by
default; the demo recipe, without a base, sets 0). It samples `replay.tokens` tokens of documents
(pipeline/mixing/replay.py) on every visible GPU (on a CPU, in `workers` processes), into `train/`
in the layout of a clean stage output, so that the default mix (pipeline/conf/mix/default.yaml,
source `<model.base_lang>-samples`) reads it like any clean text. An interrupted run keeps its finished
shards. Outputs: `train/samples-*.jsonl.gz` and the marker.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.contract import ON_ONE_GPU, Stage, StageRun
from pipeline.errors import StageError
from pipeline.mixing.replay import write_samples
from pipeline.model.files import base_model_input
from pipeline.stage_outputs import ReplayOutput


def run_replay(run: StageRun) -> dict:
    import torch

    cfg: PipelineConfig = run.cfg
    if cfg.model.base is None:
        raise StageError(
            "replay samples the base model's own text: set model.base=<local Hugging Face folder>."
        )
    if run.lang != cfg.model.base_lang:
        raise StageError(
            "replay writes text in the base's own language, "
            f"model.base_lang={cfg.model.base_lang}, "
            f"where the mix reads it; run it with lang={cfg.model.base_lang} (not lang={run.lang})."
        )
    if cfg.replay.tokens == 0:
        raise StageError(
            "replay.tokens is 0: set the number of tokens to sample, e.g. replay.tokens=6000000."
        )
    return write_samples(
        cfg.model.base,
        ReplayOutput(run.work_dir).training_split,
        cfg.replay,
        "cuda" if torch.cuda.is_available() else "cpu",
        cfg.workers,
    )


STAGE = Stage(
    name="replay",
    run=run_replay,
    config_sections=("replay",),
    # The base enters the hash by its content (base_model_input), not by where it is.
    describe_inputs=base_model_input,
    placement=lambda cfg: ON_ONE_GPU,
)
