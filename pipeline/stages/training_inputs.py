"""What the training stages read from the stages before them, as the plain values pipeline/training/ takes: the pack,
its tokenizer and the clean stage's held-out text (`prepare_training`), and the model the pack's vocabulary makes
(`model_as_trained`). warmup and pretrain share it; each says only what differs."""

from __future__ import annotations

import dataclasses
from typing import Optional

from pipeline.contract import StageRun
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.json_files import read_json
from pipeline.model.config import training_seq_len
from pipeline.packing.packed import PACKED_FILE
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer
from pipeline.training.config import TrainConfig, planned
from pipeline.training.job import TrainingJob
from pipeline.training.peak_memory import return_large_blocks_to_the_system
from pipeline.training.run import SCRATCH, StageTraining


def prepare_training(run: StageRun, train: TrainConfig, *, prefix: str = "train", share: float = 1.0,
                     trainable: Optional[list[str]] = None, resume: Optional[str] = None) -> StageTraining:
    """Read the pack, its tokenizer and the held-out text; the ranks' job, its step budget within the mix plan
    (`train.steps` null: `share` of one pass of the pack), refused before any work when it is beyond it."""
    return_large_blocks_to_the_system()  # the model passes through this process a tensor at a time
    cfg = run.cfg
    packed = run.read_input("pack", PACKED_FILE, read_json)
    seq_len = training_seq_len(cfg.model, train.seq_len)
    pack = str(run.input("pack"))
    job = TrainingJob(stage=run.stage, folder=str(run.work_dir), pack=pack, seq_len=seq_len,
                      train=planned(train, seq_len, packed["pass_tokens"], pack, prefix=prefix, share=share),
                      parallel=cfg.parallel, kernels=cfg.kernels, trainable=trainable, resume=resume)
    tokenizer = run.read_input("tokenizer", TOKENIZER_FILE, load_tokenizer)
    heldout = clean_output(run.lang, run.input("clean"), split="heldout")
    texts = (document.text for document in read_documents(heldout, run.work_dir / SCRATCH / "heldout"))
    return StageTraining(job, packed, run.input("tokenizer"), tokenizer, run.input_file("tokenizer", TOKENIZER_FILE),
                         texts)


def model_as_trained(run: StageRun):
    """cfg.model with the pack tokenizer's vocabulary, which the training stages' model has (an extended base
    tokenizer's 65,536 rows where the base has 49,152): what their memory plan must count."""
    packed = run.read_input("pack", PACKED_FILE, read_json)
    return dataclasses.replace(run.cfg.model, vocab_size=packed["tokenizer"]["vocab_size"])
