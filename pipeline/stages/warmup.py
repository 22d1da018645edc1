"""Stage `warmup`: the base model with the new tokenizer, only the embeddings (and LM head) trained.

The launching process loads the base model (`model.base`), checks that it fits the configured model,
builds the new embedding rows (`warmup.init`: `mean` or `random`, pipeline/warmstart/transfer.py) and
writes the initial model; `parallel.pp x parallel.dp` ranks then train it on DeepSpeed's pipeline
engine with ZeRO-1, the whole transformer body frozen, reading the pack stage's sampler; held-out bits
per byte are scored before and after. Outputs: `checkpoint/` (the pipeline checkpoint that
`stage=pretrain` starts from), `hf/` (a transformers folder with the new tokenizer), `metrics.jsonl`,
`report.json` and the marker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import torch

from pipeline.contract import Stage, StageError, StageRun, write_json_atomic
from pipeline.mixing.sources import clean_output, read_documents
from pipeline.model.hf_export import to_hf
from pipeline.parallel.launch import run_ranks
from pipeline.tokenization.folder import TOKENIZER_FILE
from pipeline.training.heldout import HeldoutWindows, heldout_windows
from pipeline.warmstart.base import (CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS, check_fit, load_base, load_base_tokenizer,
                                     load_checkpoint, read_model_config, save_checkpoint)
from pipeline.warmstart.initialise import warm_started

log = logging.getLogger(__name__)

TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def describe_inputs(cfg) -> dict:
    """The base model's files (names, sizes, config): a different base reruns the warm start."""
    if cfg.model.base is None:
        return {}
    folder = Path(cfg.model.base)
    files = sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
        if path.suffix == ".json":
            digest.update(path.read_bytes())
    return {"base_model": {"path": str(folder.resolve()), "files": digest.hexdigest()[:16]}}


def seq_len(cfg) -> int:
    return cfg.warmup.train.seq_len or cfg.model.max_seq_len


def trainable(cfg):
    """Only the input embeddings, the LM head (when untied) and, if asked, the embedding LayerNorm."""
    prefixes = ("embedding.tokens.", "head.") + (("embedding.norm.",) if cfg.warmup.train_embedding_norm else ())
    return lambda name: name.startswith(prefixes)


def _heldout(run: StageRun, tokenizer, eos_id: int) -> HeldoutWindows:
    train, parallel = run.cfg.warmup.train, run.cfg.parallel
    source = clean_output(run.lang, run.input_dirs["clean"], split="heldout")
    texts = (document.text for document in read_documents(source, run.work_dir / "scratch"))
    windows = heldout_windows(texts, tokenizer, eos_id, seq_len(run.cfg), train.eval_tokens,
                              multiple=train.micro_batch_size * parallel.dp)
    if len(windows) == 0:
        raise StageError(f"warmup {run.lang}: the held-out text of {run.input_dirs['clean']} gives less than one "
                         f"evaluation batch ({train.micro_batch_size * parallel.dp} sequences of {seq_len(run.cfg)} "
                         f"tokens). Lower warmup.train.seq_len or warmup.train.micro_batch_size, or raise "
                         f"clean.heldout_fraction and run the stages again.")
    return windows


def run(run: StageRun) -> dict:
    cfg = run.cfg
    if cfg.model.base is None:
        raise StageError("warmup needs a base model: set model.base=<local Hugging Face folder or pipeline "
                         "checkpoint> (with its tokenizer.json), and the matching preset, e.g. "
                         "model=bloom-560m model.base=/models/bloom-560m")
    base = load_base(cfg.model.base)
    base_tokenizer = load_base_tokenizer(cfg.model.base)
    check_fit(cfg.model, base.cfg, cfg.model.base, base_tokenizer)
    tokenizer_dir = run.input_dirs["tokenizer"]
    from tokenizers import Tokenizer

    new_tokenizer = Tokenizer.from_file(str(tokenizer_dir / TOKENIZER_FILE))
    model, transfer = warm_started(base, Path(cfg.model.base), base_tokenizer, tokenizer_dir, new_tokenizer,
                                   cfg.warmup.init, cfg.warmup.train.seed)
    log.info("warmup %s: %s initialisation of %d rows: %s", run.lang, cfg.warmup.init, model.cfg.vocab_size,
             transfer["embedding"])
    init_dir = run.work_dir / "init"
    save_checkpoint(model, init_dir)
    eos_id = new_tokenizer.token_to_id(cfg.tokenizer.special_tokens.eos)
    windows = _heldout(run, new_tokenizer, eos_id)
    np.savez(run.work_dir / "heldout.npz", tokens=windows.tokens, segment_ids=windows.segment_ids,
             target_bytes=np.int64(windows.target_bytes))
    (run.work_dir / "metrics.jsonl").unlink(missing_ok=True)
    run_ranks("pipeline.stages.warmup:train_rank", cfg, run.work_dir, cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp)
    result = json.loads((run.work_dir / "train_result.json").read_text(encoding="utf-8"))
    checkpoint = run.work_dir / "checkpoint"
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, checkpoint / name)
    trained = load_checkpoint(checkpoint)
    trained_tensors = _check_body_unchanged(base, trained, trainable(cfg))
    shutil.rmtree(run.work_dir / "hf", ignore_errors=True)
    to_hf(trained, run.work_dir / "hf", tokenizer=tokenizer_dir)
    shutil.rmtree(init_dir)
    shutil.rmtree(run.work_dir / "scratch", ignore_errors=True)
    trained_parameters = sum(t.numel() for name, t in trained.named_parameters() if name in trained_tensors)
    report = {"base": str(Path(cfg.model.base).resolve()), "init": cfg.warmup.init, "rows": transfer,
              "trained_tensors": trained_tensors, "trained_parameters": trained_parameters, **result}
    write_json_atomic(run.work_dir / "report.json", report)
    log.info("warmup %s: held-out bits per byte %.4f after %s initialisation, %.4f after %d steps",
             run.lang, result["heldout_bpb_before"], cfg.warmup.init, result["heldout_bpb_after"], result["steps"])
    return {key: value for key, value in report.items() if key != "sampler"}


def _check_body_unchanged(base, trained, is_trainable) -> list[str]:
    """Fail if training moved any frozen tensor; returns the names of the trained ones."""
    base_state = base.state_dict()
    moved = []
    for name, tensor in trained.state_dict().items():
        if is_trainable(name):
            continue
        if name not in base_state or not torch.equal(tensor.to(base_state[name].dtype), base_state[name]):
            moved.append(name)
    if moved:
        raise StageError(f"warmup: frozen tensors changed during training: {moved[:5]}. This is a bug; please report it.")
    return sorted(name for name in trained.state_dict() if is_trainable(name))


def train_rank(cfg, work_dir: Path) -> None:
    """One rank's part: build the engine over its pipeline stage, train, save its part of the model."""
    import torch.distributed as dist

    from pipeline.packing import PackedSampler
    from pipeline.training.engine import build_engine, init_distributed
    from pipeline.training.loop import train_loop
    from pipeline.training.weights import join_parts, save_part

    init_distributed()
    train = cfg.warmup.train
    model_cfg = read_model_config(work_dir / "init" / CHECKPOINT_CONFIG)
    engine = build_engine(model_cfg, train, cfg.parallel, work_dir / "init" / CHECKPOINT_WEIGHTS, trainable(cfg))
    stored = np.load(work_dir / "heldout.npz", allow_pickle=False)
    windows = HeldoutWindows(stored["tokens"], stored["segment_ids"], int(stored["target_bytes"]))
    pack_dir = Path(cfg.work_dir).absolute() / cfg.lang.code / "pack"
    sampler = PackedSampler(pack_dir, seq_len=seq_len(cfg), global_batch_size=train.global_batch_size,
                            seed=train.seed, rank=engine.dp_rank, world=engine.dp_world)
    rank = dist.get_rank()
    result = train_loop(engine, sampler, train, windows, work_dir / "metrics.jsonl", is_logger=rank == 0)
    parts = work_dir / "parts"
    parts.mkdir(exist_ok=True)
    stage = engine.engine.grid.get_pipe_parallel_rank()
    if engine.dp_rank == 0:
        save_part(engine.layers, parts / f"stage{stage:03d}.safetensors")
    dist.barrier()
    if rank == 0:
        checkpoint = work_dir / "checkpoint"
        checkpoint.mkdir(exist_ok=True)
        join_parts(sorted(parts.glob("stage*.safetensors")), checkpoint / CHECKPOINT_WEIGHTS)
        shutil.copyfile(work_dir / "init" / CHECKPOINT_CONFIG, checkpoint / CHECKPOINT_CONFIG)
        shutil.rmtree(parts)
        write_json_atomic(work_dir / "train_result.json", result)
    dist.barrier()
    dist.destroy_process_group()


STAGE = Stage(name="warmup", run=run, needs=("clean", "tokenizer", "pack"), config_sections=("model", "warmup"),
              describe_inputs=describe_inputs)
