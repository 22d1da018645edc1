"""The tensors that Qwen2, Qwen3, OLMo 2 and Gemma add to a block under tensor parallelism
(pipeline/parallel/tensor_parallel.py), on two forked gloo ranks: q/k/v biases cut with their rows,
per-head q/k norms whole with their gradients summed over the ranks, q/k norms over all heads cut
by head with their statistic summed, norms after the sublayers (and Gemma's before and after, as
offsets from one, with GeGLU, a windowed layer and capped scores); with and without sequence
parallelism, against the full block. (tests/unit/parallel/test_tensor_parallel.py trains the
BLOOM- and Llama-style models on every layout.) The ranks are spawned, not forked: a child forked
from a process whose OpenMP threads have run (any earlier test's) can hang in its first parallel
region."""

from __future__ import annotations

import copy
import multiprocessing
import traceback

import torch

from pipeline.model.model_config import ModelConfig
from pipeline.model.transformer import Block
from pipeline.parallel.tensor_parallel import apply_tensor_parallel, parameter_shards

SHAPE = {
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "ffn_size": 64,
    "vocab_size": 300,
}
VARIANTS = {
    "qwen2": ModelConfig(**SHAPE, qkv_bias=True),
    "qwen3": ModelConfig(**SHAPE, qk_norm="head", head_size=16),
    "olmo2": ModelConfig(**SHAPE, qk_norm="full", norm_placement="post"),
    "gemma": ModelConfig(
        **SHAPE,
        qk_norm="head",
        norm_placement="both",
        norm_unit_offset=True,
        activation="geglu",
        sliding_window=4,
        attention_softcap=2.0,
        attention_scale_size=12,
    ),
}
# Of the largest difference relative to the expected tensor's largest value (test_tensor_parallel's
# measure): float32 sums in another order.
TOLERANCE = 1e-5


def _error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-3)).item()


def _randomised(block: Block) -> Block:
    """Biases and norm weights away from 0 and 1, so that misplaced ones show."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in block.named_parameters():
            if parameter.dim() == 1:
                start = 1.0 if "norm" in name else 0.0
                parameter.copy_(start + 0.3 * torch.randn(parameter.shape, generator=generator))
    return block


def _errors(rank: int) -> dict[str, float]:
    group, errors = torch.distributed.group.WORLD, {}
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(0))
    segments = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    # Sequence parallelism: this rank's run of 6 of the 2 x 6 tokens, in (batch, position) order.
    part = lambda t: t.flatten(0, 1)[rank * 6 : (rank + 1) * 6].view(2, 3, *t.shape[2:])  # noqa: E731
    for name, cfg in VARIANTS.items():
        torch.manual_seed(1)
        full = _randomised(Block(cfg))
        whole = x.clone().requires_grad_()
        expected = full(whole, segments)
        weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3))
        (expected * weights).sum().backward()
        for sequence_parallel in (False, True):
            cut = part if sequence_parallel else (lambda t: t)
            parallel = apply_tensor_parallel(
                copy.deepcopy(full), cfg, group, sequence_parallel=sequence_parallel
            )
            parallel.zero_grad()
            local = cut(x).clone().requires_grad_()
            output = parallel(local, segments)
            (output * cut(weights)).sum().backward()
            label = f"{name}{' sequence-parallel' if sequence_parallel else ''}"
            errors[f"{label} output"] = _error(output, cut(expected))
            errors[f"{label} input grad"] = _error(local.grad, cut(whole.grad))
            full_parameters, shards = dict(full.named_parameters()), parameter_shards(parallel)
            for key, parameter in parallel.named_parameters():
                grad = full_parameters[key].grad
                grad = shards[key].take(grad) if key in shards else grad
                errors[f"{label} {key} grad"] = _error(parameter.grad, grad)
    return errors


def _rank(rank: int, store: str, results) -> None:
    try:
        torch.distributed.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
        results.put((rank, _errors(rank)))
        torch.distributed.destroy_process_group()
    except BaseException:
        results.put((rank, traceback.format_exc()))


def test_new_block_tensors_cut_over_two_ranks_match_the_full_block(tmp_path):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(target=_rank, args=(rank, f"file://{tmp_path / 'store'}", results))
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    try:
        answers = dict(results.get(timeout=120) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():  # a rank that hangs must not outlive the test
                process.kill()
    for rank, errors in answers.items():
        assert isinstance(errors, dict), errors  # a traceback from the rank
        names = " ".join(errors)
        for tensor in (
            "attn.q.bias",
            "attn.q_norm.weight",
            "attn.k_norm.weight",
            "attn_norm",
            "mlp_out_norm",
            "mlp.gate",
        ):
            assert tensor in names, tensor
        wrong = {key: error for key, error in errors.items() if error > TOLERANCE}
        assert not wrong, (rank, wrong)
