"""A training stage's run, both sides: the launching process (held-out windows, the ranks, the result) and
each rank (engine, sampler, resume, loop, the trained model).

Files in the stage's work folder: `init/` (the starting model, single-model names), `heldout.npz`,
`checkpoints/` (pretrain), `metrics.jsonl`, `tensorboard/`, `train_result.json` and `checkpoint/` (the
trained model as a pipeline checkpoint).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from pipeline.contract import StageError, StageRun, write_json_atomic
from pipeline.model.hf_export import TOKENIZER_FILES, to_hf
from pipeline.mixing.sources import clean_output, read_documents
from pipeline.parallel.launch import run_ranks
from pipeline.training.config import ParallelConfig, TrainConfig
from pipeline.training.heldout import HeldoutWindows, heldout_windows
from pipeline.warmstart.base import CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS, load_checkpoint, read_model_config

log = logging.getLogger(__name__)

HELDOUT_FILE = "heldout.npz"
RESULT_FILE = "train_result.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


def write_heldout(run: StageRun, train: TrainConfig, parallel: ParallelConfig, seq_len: int, tokenizer,
                  eos_id: int, key: str) -> None:
    """The held-out windows every rank scores, from the clean stage's held-out split."""
    source = clean_output(run.lang, run.input_dirs["clean"], split="heldout")
    texts = (document.text for document in read_documents(source, run.work_dir / "scratch"))
    multiple = train.micro_batch_size * parallel.dp
    windows = heldout_windows(texts, tokenizer, eos_id, seq_len, train.eval_tokens, multiple=multiple)
    if len(windows) == 0:
        raise StageError(f"{run.stage} {run.lang}: the held-out text of {run.input_dirs['clean']} gives less than "
                         f"one evaluation batch ({multiple} sequences of {seq_len} tokens). Lower {key}.seq_len or "
                         f"{key}.micro_batch_size, or raise clean.heldout_fraction and run the stages again.")
    np.savez(run.work_dir / HELDOUT_FILE, tokens=windows.tokens, segment_ids=windows.segment_ids,
             target_bytes=np.int64(windows.target_bytes))
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)


def launch(entry: str, run: StageRun) -> dict:
    """Run `entry` on tp x pp x dp ranks; returns what rank 0 wrote to train_result.json."""
    parallel = run.cfg.parallel
    (run.work_dir / RESULT_FILE).unlink(missing_ok=True)
    run_ranks(entry, run.cfg, run.work_dir, parallel.tp * parallel.pp * parallel.dp)
    return json.loads((run.work_dir / RESULT_FILE).read_text(encoding="utf-8"))


def export_trained(run: StageRun, tokenizer_dir: Path):
    """The trained model of `checkpoint/` with its tokenizer beside it, and as a transformers folder `hf/`."""
    trained_dir = run.work_dir / "checkpoint"
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, trained_dir / name)
    trained = load_checkpoint(trained_dir)
    shutil.rmtree(run.work_dir / "hf", ignore_errors=True)
    to_hf(trained, run.work_dir / "hf", tokenizer=tokenizer_dir)
    return trained


def rank_training(cfg, work_dir: Path, train: TrainConfig, seq_len: int, trainable: Callable[[str], bool],
                  resume: Optional[str] = None) -> None:
    """One rank: train the model of `init/` and write the result; `resume` (auto|never) enables checkpoints."""
    import torch.distributed as dist

    from pipeline.kernels import set_backend
    from pipeline.model.flops import flops_per_token
    from pipeline.packing import PackedSampler
    from pipeline.training import checkpoint
    from pipeline.training.engine import build_engine, init_distributed
    from pipeline.training.loop import Checkpointing, RunState, train_loop
    from pipeline.training.weights import join_parts, save_part

    set_backend(cfg.kernels)
    init_distributed()
    rank = dist.get_rank()
    model_cfg = read_model_config(work_dir / "init" / CHECKPOINT_CONFIG)
    engine = build_engine(model_cfg, train, cfg.parallel, work_dir / "init" / CHECKPOINT_WEIGHTS, trainable)
    stored = np.load(work_dir / HELDOUT_FILE, allow_pickle=False)
    windows = HeldoutWindows(stored["tokens"], stored["segment_ids"], int(stored["target_bytes"]))
    pack_dir = Path(cfg.work_dir).absolute() / cfg.lang.code / "pack"
    sampler = PackedSampler(pack_dir, seq_len=seq_len, global_batch_size=train.global_batch_size,
                            seed=train.seed, rank=engine.dp_rank, world=engine.dp_world)
    state, checkpointing = RunState(), None
    if resume is not None:
        root = work_dir / CHECKPOINTS
        found = checkpoint.latest(root)
        if found is not None:
            saved = checkpoint.load(engine, found)
            sampler.load_state_dict(saved["sampler"])
            state = RunState(**saved["run"])
            if rank == 0:
                log.info("Resuming from %s (step %d of %d)", found, state.step, train.steps)

        def save(step: int) -> Path:
            return checkpoint.save(engine, root, step, {"run": state.as_dict(), "sampler": sampler.state_dict()},
                                   train.keep_checkpoints)

        checkpointing = Checkpointing(train.checkpoint_every, save)
    result = train_loop(engine, sampler, train, windows, work_dir / METRICS_FILE, is_logger=rank == 0,
                        flops_per_token=flops_per_token(model_cfg, seq_len), run=state, checkpointing=checkpointing)
    parts = work_dir / "parts"
    if rank == 0:
        parts.mkdir(exist_ok=True)
    dist.barrier()
    if engine.dp_rank == 0:
        save_part(engine.layers, parts / f"stage{engine.engine.grid.get_pipe_parallel_rank():03d}.safetensors")
    dist.barrier()
    if rank == 0:
        trained = work_dir / "checkpoint"
        trained.mkdir(exist_ok=True)
        join_parts(sorted(parts.glob("stage*.safetensors")), trained / CHECKPOINT_WEIGHTS)
        shutil.copyfile(work_dir / "init" / CHECKPOINT_CONFIG, trained / CHECKPOINT_CONFIG)
        shutil.rmtree(parts)
        write_json_atomic(work_dir / RESULT_FILE, result)
    dist.barrier()
    dist.destroy_process_group()
