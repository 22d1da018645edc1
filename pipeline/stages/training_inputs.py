"""What the training stages read from the stages before them, and the ranks' job made from it: the
pack, its tokenizer and the clean stage's held-out text (and the downstream tasks the loop scores,
`train.eval_tasks`), with the training section completed (`prepare_training`). warmup and pretrain
share it; each says only what differs.

The learning rate and the rest of a training section travel one way: from the config here, through
the job (pipeline/training/job.py: its micro-batch and step budget completed, written for the ranks)
and each rank (pipeline/training/rank.py), to the optimizer (pipeline/training/engine.py)."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from pathlib import Path
from typing import Optional

from pipeline.contract import StageRun
from pipeline.corpus.sources import read_documents
from pipeline.memory_fit import check_layout, fitting_micro_batch
from pipeline.model.model_config import training_seq_len
from pipeline.stage_outputs import CleanOutput, PackOutput, TokenizerOutput
from pipeline.training.job import planned_job
from pipeline.training.peak_memory import return_large_blocks_to_the_system
from pipeline.training.run import SCRATCH, StageTraining


def prepare_training(
    run: StageRun,
    section: str,
    *,
    share: float = 1.0,
    trainable: Optional[list[str]] = None,
    resume: Optional[str] = None,
    refuse_unfit_layout: bool = False,
    continue_from: Optional[Path] = None,
    start_step: int = 0,
) -> StageTraining:
    """Read the pack, its tokenizer and the held-out text, and make the ranks' job of the config's
    training `section` (`train`, `warmup.train`): a null micro-batch becomes the largest that fits
    the device for the model as it trains (with `refuse_unfit_layout`, a layout that cannot fit is
    refused with one that does), and the step budget is the mix plan's (`steps` null: `share` of one
    pass of the pack), refused before any work when it is beyond it; a run that continues another
    starts from its final state (`continue_from`, of step `start_step`) and may go beyond."""
    return_large_blocks_to_the_system()  # the model passes through this process a tensor at a time
    cfg, train = run.cfg, attrgetter(section)(run.cfg)
    packed = read_pack(run)
    # The model as it trains: with the pack tokenizer's vocabulary (an extended base tokenizer's
    # 65,536 rows where the base has 49,152), which the memory plan must count.
    model = dataclasses.replace(cfg.model, vocab_size=packed["tokenizer"]["vocab_size"])
    fitted = fitting_micro_batch(cfg, train, prefix=section, model=model)
    if refuse_unfit_layout:
        check_layout(cfg, fitted, model)
    pack, tokenizer = run.output(PackOutput), run.output(TokenizerOutput)
    seq_len = training_seq_len(cfg.model, train.seq_len)
    job = planned_job(
        run.stage,
        run.work_dir,
        train,
        micro_batch_size=fitted.micro_batch_size,
        seq_len=seq_len,
        pack=pack.folder,
        pass_tokens=packed["pass_tokens"],
        parallel=cfg.parallel,
        kernels=cfg.kernels,
        prefix=section,
        share=share,
        trainable=trainable,
        resume=resume,
        continue_from=continue_from,
        start_step=start_step,
    )
    loaded = run.read_input(tokenizer.tokenizer)
    heldout = run.output(CleanOutput).heldout_text(run.lang)
    texts = (
        document.text for document in read_documents(heldout, run.work_dir / SCRATCH / "heldout")
    )
    return StageTraining(
        job,
        packed,
        tokenizer.folder,
        loaded,
        run.input_file(tokenizer.tokenizer),
        texts,
        eval_tasks=cfg.eval.tasks,
        task_start=cfg.eval.document_start,
    )


def read_pack(run: StageRun) -> dict:
    """The pack stage's packed.json: its tokens per pass and its tokenizer's vocabulary."""
    return run.read_input(run.output(PackOutput).packed)
