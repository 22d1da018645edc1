"""A training stage's launching side: the held-out rows, the ranks, and the trained model as a transformers
folder. The rank side is pipeline/training/rank.py; the files they share are named in outputs.py."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Iterable

from pipeline.contract import MARKER
from pipeline.errors import StageError
from pipeline.evaluation.bits_per_byte import scoring_rows
from pipeline.model.files import refuse_non_finite
from pipeline.model.hf_export import TOKENIZER_FILES, NonFiniteWeights, to_hf
from pipeline.model.model_tensors import CheckpointTensors
from pipeline.packing.packed import PACKED_FILE
from pipeline.parallel.ranks import distributed_environment, free_port, run_ranks
from pipeline.tokenization.folder import tokenizer_digest
from pipeline.training.heldout import save_rows
from pipeline.training.job import TrainingJob, write_job
from pipeline.training.outputs import EXPORT, HELDOUT_FILE, METRICS_FILE, RESULT_FILE, TRAINED

log = logging.getLogger(__name__)


def write_heldout(job: TrainingJob, texts: Iterable[str], tokenizer, start_id: int) -> dict:
    """The held-out rows every rank scores: documents in windows of the training length moving on by half of it,
    up to `train.eval_tokens` scored tokens, padded to whole batches. Returns their size."""
    rows = scoring_rows(texts, tokenizer, start_id, job.seq_len, stride=max(1, job.seq_len // 2),
                        max_tokens=job.train.eval_tokens)
    if rows.documents == 0:
        raise StageError(f"{job.stage}: the held-out text is empty, so held-out bits per byte cannot be scored. Run "
                         f"the clean stage again with a larger held-out split (clean.heldout_min_documents, "
                         f"clean.heldout_fraction), or give it more text.")
    save_rows(rows.padded_to(job.train.micro_batch_size * job.parallel.dp), Path(job.folder) / HELDOUT_FILE)
    return {"documents": rows.documents, "tokens": rows.tokens, "bytes": rows.bytes}


def check_pack_tokenizer(job: TrainingJob, packed: dict, tokenizer_file: Path, vocab_size: int) -> None:
    """The token ids in the pack are those of the tokenizer the pack stage used: the one this stage loads must be
    it (same vocabulary size and file hash), checked before any rank starts."""
    recorded = packed["tokenizer"]
    found = {"vocab_size": vocab_size, "sha256": tokenizer_digest(tokenizer_file)}
    differs = [key for key in found if key in recorded and recorded[key] != found[key]]
    if differs:
        raise StageError(f"{job.stage}: the tokenizer {tokenizer_file} ({found['vocab_size']:,} tokens, sha256 "
                         f"{found['sha256'][:12]}) is not the one the data in {job.pack} was packed with "
                         f"({recorded['vocab_size']:,} tokens, sha256 {recorded.get('sha256', '?')[:12]}, recorded "
                         f"in its {PACKED_FILE}): the token ids would not match. The tokenizer was changed after the "
                         f"pack stage ran; run both again (delete {tokenizer_file.parent / MARKER}, then "
                         f"stage=tokenizer and stage=pack).")


def launch(job: TrainingJob, cluster) -> dict:
    """Train on tp x pp x dp ranks; returns what rank 0 wrote to train_result.json. One rank outside Slurm runs
    in this process: no start-up cost for the demo, and a debugger sees the training loop."""
    folder = Path(job.folder)
    (folder / RESULT_FILE).unlink(missing_ok=True)
    world_size = job.parallel.world_size
    # DeepSpeed takes a while to import and start: say what comes before it does.
    log.info("%s: starting DeepSpeed on %d rank(s) (tp %d x pp %d x dp %d) for %d steps of %d sequences x %d tokens; "
             "progress below, metrics in %s", job.stage, world_size, job.parallel.tp, job.parallel.pp, job.parallel.dp,
             job.train.steps, job.train.global_batch_size, job.seq_len, folder / METRICS_FILE)
    if world_size == 1 and cluster.executor != "slurm":
        from pipeline.training.rank import train_rank  # DeepSpeed: only when a training stage runs

        os.environ.update(distributed_environment(0, 1, free_port()))
        train_rank(job)
    else:
        run_ranks(["-m", "pipeline.training.worker", str(write_job(job))], world_size, cluster, folder / "rank_logs")
    result = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    # last_loss is None when a resumed run had no step left to take.
    bad = {key: result[key] for key in ("last_loss", "heldout_bpb_after")
           if result[key] is not None and not math.isfinite(result[key])}
    if bad:
        raise StageError(f"{job.stage}: training ended with {', '.join(f'{key} {value}' for key, value in bad.items())}"
                         f" ({result['skipped_steps']} of {result['steps']} steps skipped); the model is neither "
                         f"exported nor marked done. Its metrics are in {folder / METRICS_FILE}. Lower the "
                         f"learning rate, raise its warm-up steps or check the data and the starting model, then "
                         f"run again.")
    return result


def export_trained(folder: Path, tokenizer_dir: Path, max_shard_bytes: int) -> None:
    """The trained model of `checkpoint/` with its tokenizer beside it, and as a transformers folder `hf/` in shards
    of at most `max_shard_bytes`, written a tensor at a time (this process never holds the model)."""
    trained_dir = folder / TRAINED
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, trained_dir / name)
    shutil.rmtree(folder / EXPORT, ignore_errors=True)
    try:
        to_hf(CheckpointTensors(trained_dir), folder / EXPORT, tokenizer=tokenizer_dir, max_shard_bytes=max_shard_bytes)
    except NonFiniteWeights as error:
        shutil.rmtree(folder / EXPORT, ignore_errors=True)
        refuse_non_finite(error.names, f"The trained model in {trained_dir}", "it is neither exported nor marked "
                          "done. Lower the learning rate or check the data and the starting model, then run again.")
