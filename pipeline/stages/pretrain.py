"""Stage `pretrain`: continued pretraining of the whole model, tensor x pipeline x data parallel on DeepSpeed.

The launching process writes the starting model a tensor at a time (`init`: the warmup stage's checkpoint, a
Hugging Face folder `model.base` that uses the pack's tokenizer, or random weights, each tensor drawn from its own
seed so that every layout starts from the same model) and the held-out rows; then
`parallel.tp x parallel.pp x parallel.dp` ranks train it with ZeRO-1 from the pack sampler
(pipeline/training/), checkpointing every `train.checkpoint_every` steps and on SIGUSR1/SIGTERM.
`resume=auto` continues an interrupted run from its newest checkpoint that verifies, with the same configuration
(also with another data-parallel degree, micro-batch size or how often it logs, scores and checkpoints) or with
another step budget `train.steps` (the schedule is computed for the new total from the checkpoint's step on); any
other change is refused while those checkpoints exist. `resume=never` moves them aside and starts again.
Outputs: `checkpoint/` (pipeline checkpoint), `hf/` (transformers folder with the tokenizer), `metrics.jsonl`,
`tensorboard/`, `report.json` and the marker.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

from pipeline.contract import Stage, StageRun, read_json, write_json_atomic
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError
from pipeline.model.config import training_seq_len
from pipeline.model.export_config import shard_bytes
from pipeline.model.files import base_identity, base_tensors, check_fit, refuse_non_finite
from pipeline.model.model_tensors import ScratchTensors, opened_checkpoint, write_checkpoint
from pipeline.packing.packed import PACKED_FILE
from pipeline.planning import check_layout
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer, token_roles
from pipeline.training.config import planned
from pipeline.training.checkpoint_files import checkpoint_step, checkpoints, describe
from pipeline.training.job import TrainingJob
from pipeline.training.outputs import CHECKPOINTS, INIT, METRICS_FILE, TRAINED
from pipeline.training.peak_memory import peak_memory, return_large_blocks_to_the_system
from pipeline.training.run import check_pack_tokenizer, export_trained, launch, write_heldout

log = logging.getLogger(__name__)


def needs_when(cfg) -> tuple[str, ...]:
    return ("warmup",) if cfg.init == "warmup" else ()


def describe_inputs(cfg) -> dict:
    """Where the weights start when not from the warmup stage: the base model's files."""
    if cfg.init == "hf":
        if cfg.model.base is None:
            raise StageError("pretrain init=hf needs model.base=<local Hugging Face folder> whose tokenizer is the "
                             "pack's (e.g. work/<lang>/warmup/hf).")
        return {"base_model": base_identity(cfg, cfg.model.base)}
    return {}


def check_resume(partial: Path, cfg) -> list[str]:
    """An interrupted run continues with another train.steps only if the budget lies at or past its newest
    checkpoint (fewer steps would end before where it already is)."""
    newest = max((checkpoint_step(path) for path in checkpoints(partial / CHECKPOINTS)), default=0)
    if cfg.train.steps is not None and cfg.train.steps < newest:
        return [f"its newest checkpoint is at step {newest}, past train.steps={cfg.train.steps}"]
    return []


def kept_state(partial: Path) -> str:
    return describe(partial / CHECKPOINTS)


def write_initial_model(run: StageRun, tokenizer) -> None:
    """The starting model as the checkpoint `init/` that the ranks read their shares from, written a tensor at a
    time (this process never holds the model): the warmup stage's, `model.base`'s, or a random one."""
    cfg = run.cfg
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if cfg.init == "scratch":
        tensors = ScratchTensors(dataclasses.replace(cfg.model, vocab_size=vocab), cfg.train.seed)
        source = f"a random initialisation with model.init_std={cfg.model.init_std}"
    elif cfg.init == "warmup":
        source = run.input("warmup") / TRAINED
        tensors = run.read_input("warmup", TRAINED, opened_checkpoint)
    else:
        source = Path(cfg.model.base)
        tensors = base_tensors(cfg.model.base)
        if load_tokenizer(cfg.model.base).get_vocab() != tokenizer.get_vocab():
            raise StageError(f"pretrain init=hf: the tokenizer of {source} is not the one the data was packed with "
                             f"({run.input('tokenizer') / TOKENIZER_FILE}). Continue from a model that uses "
                             f"it (the warmup stage's output: init=warmup, or its hf/ folder), or warm-start "
                             f"this base model first: python -m pipeline stage=warmup lang={run.lang} "
                             f"model.base={source}")
    check_fit(cfg.model, tensors.cfg, str(source), tokenizer)
    if tensors.cfg.vocab_size != vocab:
        raise StageError(f"pretrain: the model of {source} has {tensors.cfg.vocab_size} vocabulary rows, the pack's "
                         f"tokenizer {vocab}; they must be the same (run warmup for this tokenizer).")
    non_finite = write_checkpoint(tensors, run.work_dir / INIT)
    refuse_non_finite(non_finite, f"pretrain: the starting model ({source})", "every training step would be "
                      "skipped. Start from a sound model: run the stage that made it again, or check model.init_std.")


def training_job(run: StageRun, packed: dict) -> TrainingJob:
    """The ranks' job, its step budget that of the mix plan (train.steps null) or within it."""
    cfg = run.cfg
    seq_len = training_seq_len(cfg.model, cfg.train.seq_len)
    pack = str(run.input("pack"))
    return TrainingJob(stage="pretrain", folder=str(run.work_dir), pack=pack, seq_len=seq_len,
                       train=planned(cfg.train, seq_len, packed["pass_tokens"], pack), parallel=cfg.parallel,
                       kernels=cfg.kernels, resume=cfg.resume)


def run_pretrain(run: StageRun) -> dict:
    cfg = run.cfg
    return_large_blocks_to_the_system()  # the model passes through a tensor at a time
    check_layout(cfg)  # a layout that cannot fit the device is refused before any work, with one that fits
    tokenizer_dir = run.input("tokenizer")
    tokenizer = run.read_input("tokenizer", TOKENIZER_FILE, load_tokenizer)
    saved = run.work_dir / CHECKPOINTS
    if not checkpoints(saved):  # a fresh start: no metrics of an attempt that left no checkpoint
        (run.work_dir / METRICS_FILE).unlink(missing_ok=True)
        shutil.rmtree(run.work_dir / "tensorboard", ignore_errors=True)
    packed = run.read_input("pack", PACKED_FILE, read_json)
    job = training_job(run, packed)  # a budget beyond the plan is refused before the model is written
    write_initial_model(run, tokenizer)
    check_pack_tokenizer(job, packed, run.input_file("tokenizer", TOKENIZER_FILE), tokenizer.get_vocab_size())
    heldout = clean_output(run.lang, run.input("clean"), split="heldout")
    texts = (document.text for document in read_documents(heldout, run.work_dir / "scratch"))
    scored = write_heldout(job, texts, tokenizer, token_roles(tokenizer_dir, tokenizer)["eos"])
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    result = launch(job, cfg.cluster)
    export_trained(run.work_dir, tokenizer_dir, shard_bytes(cfg.export))
    # The run is complete: the final model is in checkpoint/ and hf/; the resumable states are not needed.
    shutil.rmtree(saved, ignore_errors=True)
    shutil.rmtree(run.work_dir / INIT)
    report = {"init": cfg.init, "parallel": dataclasses.asdict(cfg.parallel), "heldout_scored": scored, **result,
              # this process: the starting model, the export (and the training, with one rank started here)
              "peak_memory_stage_process": peak_memory()}
    write_json_atomic(run.work_dir / "report.json", report)
    log.info("pretrain %s: held-out bits per byte %.4f -> %.4f after %d steps (%s tokens; scored on %s held-out "
             "tokens, train.eval_tokens; stage=evaluate scores up to eval.max_bytes of the same text)", run.lang,
             result["heldout_bpb_before"], result["heldout_bpb_after"], result["steps"], f"{result['tokens']:,}",
             f"{scored['tokens']:,}")
    return report


STAGE = Stage(
    name="pretrain",
    run=run_pretrain,
    needs=("clean", "tokenizer", "pack"),
    needs_when=needs_when,
    hint="With init=warmup it starts from the warmup stage's model; init=hf (model.base) and init=scratch need "
         "no warmup.",
    config_sections=("model", "train", "init"),
    # How often to log, score and checkpoint, how much to recompute and how the global batch is cut into micro
    # batches do not change the model: a run interrupted with one setting resumes with another. model.base is
    # described by its content (describe_inputs) when init=hf reads it, and not read otherwise.
    unhashed_keys=("train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
                   "train.max_bad_steps", "train.max_skipped_fraction", "train.skipped_window",
                   "train.activation_checkpoint_interval", "train.micro_batch_size", "model.base"),
    # A larger step budget continues an interrupted run from its checkpoints (checkpoint.py: the schedule).
    resumable_keys=("train.steps",),
    check_resume=check_resume,
    kept_state=kept_state,
    describe_inputs=describe_inputs,
    gpu=True,
)
