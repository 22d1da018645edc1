"""Stage `tokenizer`: a tokenizer for the language, trained on the mix plan's data, and how well it
fits.

Samples the training text from the mix plan's sources in the plan's proportions, bounded by
`tokenizer.sample_bytes` (pipeline/tokenization/sample.py); trains byte-level BPE with Hugging Face
`tokenizers` or SentencePiece (Unigram or BPE, converted to `tokenizers`); writes `tokenizer.json`
(and SentencePiece's `tokenizer.model`) with the files `transformers` needs
(pipeline/tokenization/build.py); and scores it, next to the base model's tokenizer
(`tokenizer.base`, else `model.base`'s), on the held-out text of `clean`
(pipeline/tokenization/scoring.py): `report.json`, `report.md`, the table in the log and the scores
in the marker. With `tokenizer.keep_base=true` it trains nothing: it adopts the base's tokenizer
(`tokenizer.base`, else `model.base`) with the base's own special tokens, writes the same files and
scores it, so that the data can be packed for continued pretraining with the old vocabulary. With
`tokenizer.extend_base=true` it keeps the base's tokenizer and adds `tokenizer.added_tokens` tokens
learnt on the sample as the base cuts it (pipeline/tokenization/extension.py) from the target
language's text alone, with the base's own special tokens, leaving out the tokens that the plan's
other sources use (`tokenizer.spare_ratio`). The Python-bound work on text runs on `workers`
processes, `tokenizers` on as many threads (pipeline/tokenization/workers.py): the files, the report
and the marker are the same for any `workers`.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Optional

from pipeline.config import PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.errors import StageError
from pipeline.stage_outputs import CleanOutput, MixOutput
from pipeline.tokenization.build import build_tokenizer
from pipeline.tokenization.folder import TOKENIZER_FILE, base_tokenizer_file
from pipeline.tokenization.scoring import write_report
from pipeline.tokenization.workers import use_threads


def base_source(cfg: PipelineConfig) -> Optional[str]:
    """The base tokenizer, to compare with (or, kept, to adopt): `tokenizer.base`, else
    `model.base`'s. The demo (`stage=all` without model.base) gives its own English base model as
    model.base."""
    return cfg.tokenizer.base if cfg.tokenizer.base is not None else cfg.model.base


def base_file(cfg: PipelineConfig) -> Optional[Path]:
    """The base tokenizer's tokenizer.json; None when there is no base, or model.base holds none
    (nothing to compare with: a stage that needs the base's tokenizer says so itself)."""
    source = base_source(cfg)
    return None if source is None else base_tokenizer_file(source)


def describe_inputs(cfg: PipelineConfig) -> dict:
    """The base tokenizer's content: a changed base file reruns the report (or, kept, the stage)."""
    path = base_file(cfg)
    if path is None and (
        cfg.tokenizer.keep_base or cfg.tokenizer.extend_base
    ):  # tokenizer.base: the config's check
        key, use = (
            ("keep_base", "adopts") if cfg.tokenizer.keep_base else ("extend_base", "extends")
        )
        raise StageError(
            f"tokenizer.{key}=true {use} the tokenizer of model.base={base_source(cfg)}, but it "
            "holds "
            f"no {TOKENIZER_FILE}. Save the model's tokenizer there, or give tokenizer.base=<its "
            f"{TOKENIZER_FILE} or folder>."
        )
    if path is None:
        return {}
    return {"base_tokenizer": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}}


def run_tokenizer(run: StageRun) -> dict:
    cfg: PipelineConfig = run.cfg
    use_threads(cfg.workers)
    scratch = run.work_dir / "scratch"
    shutil.rmtree(
        scratch, ignore_errors=True
    )  # an interrupted run's sample is rewritten from the start
    scratch.mkdir(parents=True)
    # A kept tokenizer samples nothing: it does not read the plan.
    plan_sources = (
        [] if cfg.tokenizer.keep_base else run.read_input(run.output(MixOutput).plan)["sources"]
    )
    built = build_tokenizer(
        run.work_dir,
        cfg.tokenizer,
        run.lang,
        plan_sources,
        base_source(cfg),
        cfg.work_dir,
        cfg.workers,
        scratch,
    )
    metrics = write_report(
        run.work_dir,
        run.final_dir,
        built,
        cfg.tokenizer,
        base_source(cfg),
        run.output(CleanOutput).heldout_text(run.lang),
        cfg.lang,
        cfg.clean,
        cfg.work_dir,
        scratch,
        cfg.workers,
    )
    shutil.rmtree(scratch)
    return metrics


STAGE = Stage(
    name="tokenizer",
    run=run_tokenizer,
    needs=("clean", "mix"),
    config_sections=("tokenizer",),
    # The base tokenizer enters the hash by its content (describe_inputs), not by where it is.
    unhashed_keys=("tokenizer.base",),
    describe_inputs=describe_inputs,
)
