"""Collectives of tensor-parallel ranks on real gloo process groups: two ranks, TORCH_DISTRIBUTED_DEBUG=DETAIL
(every collective's kind and shapes checked against the other rank's) and a short process-group timeout, so that
a mismatch fails here within seconds instead of hanging.

The vocabulary-parallel training loss (pipeline_model.token_loss, the LM head fused with the cross-entropy) must cut
the tokens into the same chunks on every rank, although the last shard holds fewer real vocabulary rows than the
others, or none: each chunk's statistics are all-reduced, and ranks that cut differently would wait on each other
forever (issue 28: TP2 hung on NCCL with vocabulary 50,304). The chunks are made small here through the constant
the training loss reads, so that several chunks run; losses and gradients must match one rank's.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from pipeline.model import ModelConfig
from pipeline.parallel.ranks import free_port, rank_environment
from tests.conftest import REPO, repo_pythonpath

# With tp=2 and model.pad_vocab_multiple=128, vocabulary 300 is cut into shards of 256 rows holding 256 and 44 real
# ids; vocabulary 100 into shards of 128 holding 100 and none (the second rank holds padding only).
VOCABULARIES = (300, 100)
# The fused head's logits per chunk (pipeline.kernels.fused_head.CHUNK_LOGIT_ELEMENTS, 128M in training): 4 rows
# of a 128-row shard, 2 of a 256-row one, so that the 18 tokens below take 5 to 9 chunks.
CHUNK_LOGIT_ELEMENTS = 512
HIDDEN = 16
ERRORS_FILE = "errors.json"
RANK_TIMEOUT_S = 20  # the process group's; the launch below gives the ranks a little longer to start and fail


# ---- in the ranks -------------------------------------------------------------------------------------------

def _model(vocab: int, tied: bool) -> ModelConfig:
    return ModelConfig(hidden_size=HIDDEN, num_layers=1, num_heads=2, num_kv_heads=2, ffn_size=32, vocab_size=vocab,
                       tie_embeddings=tied, max_seq_len=16)


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-6)).item()


def _loss_errors() -> dict[str, float]:
    """The tensor-parallel loss of each vocabulary, tied and untied head, against one rank's: loss, the hidden
    states' gradient and this rank's rows of the head's gradient."""
    import torch.distributed as dist

    from pipeline.kernels import fused_head
    from pipeline.parallel.pipeline_model import EmbeddingLayer, HeadLayer, ParallelHeadLayer, _tied_head, token_loss
    from pipeline.parallel.tensor_parallel import apply_tensor_parallel

    fused_head.CHUNK_LOGIT_ELEMENTS = CHUNK_LOGIT_ELEMENTS
    group = dist.group.WORLD
    errors = {}
    for vocab in VOCABULARIES:
        for tied in (True, False):
            cfg = _model(vocab, tied)
            torch.manual_seed(vocab)  # the same on both ranks
            full = EmbeddingLayer(cfg) if tied else HeadLayer(cfg)
            hidden = torch.randn(2, 9, HIDDEN)
            targets = torch.randint(0, vocab, (2, 9))
            targets[0, :2] = torch.tensor([0, vocab - 1])  # the first and the last real id
            targets[1, 4] = -100

            full_hidden = hidden.clone().requires_grad_()
            outputs = _tied_head(full, full_hidden) if tied else full(full_hidden)
            expected = token_loss(vocab)(outputs, targets)
            expected.backward()
            full_weight = outputs[1]

            if tied:
                parallel = apply_tensor_parallel(copy.deepcopy(full), cfg, group)
                head = lambda h, parallel=parallel: _tied_head(parallel, h)  # noqa: E731
            else:
                head = parallel = ParallelHeadLayer(copy.deepcopy(full), group, cfg.pad_vocab_multiple)
            local_hidden = hidden.clone().requires_grad_()
            outputs = head(local_hidden)
            loss = token_loss(vocab, group)(outputs, targets)
            loss.backward()
            weight = outputs[1]
            name = f"vocabulary {vocab} {'tied' if tied else 'untied'}"
            errors[f"{name} loss"] = _max_error(loss.detach(), expected.detach())
            errors[f"{name} hidden grad"] = _max_error(local_hidden.grad, full_hidden.grad)
            errors[f"{name} weight grad"] = _max_error(weight.grad, weight.tp_shard.take(full_weight.grad))
    return errors


def loss_rank_entry(work_dir: Path) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
    errors = _loss_errors()
    if dist.get_rank() == 0:
        (work_dir / ERRORS_FILE).write_text(json.dumps(errors), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


# ---- in the test process -------------------------------------------------------------------------------------

def _run_two_ranks(entry: str, work_dir: Path, limit_s: float) -> tuple[list[int], list[str]]:
    """`entry(work_dir)` of this module in two gloo ranks with collectives checked; their exit codes and outputs.
    Ranks still running after `limit_s` are killed (exit code None): a hang fails the test instead of stalling it."""
    code = f"from pathlib import Path; from tests.test_collectives import {entry}; {entry}(Path({str(work_dir)!r}))"
    port = free_port()
    logs = [work_dir / f"rank{rank}.log" for rank in range(2)]
    processes = []
    for rank, log in enumerate(logs):
        env = {**rank_environment(rank, 2, port, threads=1), "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
               "PYTHONPATH": repo_pythonpath()}
        with open(log, "w", encoding="utf-8") as output:
            processes.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=output,
                                              stderr=subprocess.STDOUT))
    deadline = time.monotonic() + limit_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(None)
    return codes, [log.read_text(encoding="utf-8", errors="replace") for log in logs]


def test_vocabulary_parallel_loss_matches_one_rank_with_uneven_shards_in_several_chunks(tmp_path):
    codes, outputs = _run_two_ranks("loss_rank_entry", tmp_path, limit_s=RANK_TIMEOUT_S + 60)
    assert codes == [0, 0], "\n\n".join(f"rank {rank} (exit {code}):\n{text[-4000:]}"
                                        for rank, (code, text) in enumerate(zip(codes, outputs)))
    errors = json.loads((tmp_path / ERRORS_FILE).read_text(encoding="utf-8"))
    assert len(errors) == 3 * 2 * len(VOCABULARIES)
    assert {name: error for name, error in errors.items() if not error < 1e-5} == {}

