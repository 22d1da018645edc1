"""Benchmark: training throughput and MFU of ~1.3B models (or Llama-shaped ones of 7B to 70B widths,
cut in depth), our stack against plain PyTorch and Hugging Face.

Two models of the same size (`--models alibi,rope`): BLOOM-shaped (ALiBi, LayerNorm, embedding
LayerNorm, GELU, biases, tied head) and Llama-shaped (RoPE, RMSNorm, SwiGLU of width `--ffn`, by
default 8/3 x hidden rounded up to 256, no biases, tied head; grouped-query attention with
`--kv-heads`). `--shape` picks the widths and depth: 1.3b (the default), or the Llama widths where
tensor parallelism is used, 7b, 7b-ffn11008, 13b and 70b (grouped-query attention with 8 key/value
heads, vocabulary 32768), with as many layers as one 80 GB GPU holds for the single-GPU runs
(SHAPES says how that was estimated). Those are the RoPE model's shapes: `--models` then defaults
to rope, and the BLOOM-shaped ALiBi model is refused. Four roles train them:
- ours: what the warmup and pretrain stages run, `pipeline.training.engine.build_engine`
  (DeepSpeed's PipelineEngine, ZeRO-1, bf16 parameters with fp32 master weights, our Triton
  attention and norms, fused AdamW);
- anchor: the same model as plain PyTorch (bench/anchor_model.py: FlexAttention with an ALiBi
  score_mod and a causal block mask, or SDPA with is_causal=True; `torch.compile` per block), fp32
  weights under bf16 autocast (what the HF Trainer's `bf16=True` does), torch.optim.AdamW with
  `fused=True`;
- tp-anchor: the anchor at each of our layouts with tp > 1 and pp 1 (`2x1x1`, `4x1x1`, `2x1x2`,
  `2x1x1+sp`, ...), in its own `torchrun`: torch's tensor parallelism (`parallelize_module` on a
  (dp, tp) DeviceMesh, bench/anchor_tensor_parallel.py): q, k and v as three projections cut by
  heads, column- and row-parallel layers, vocab-parallel embedding and tied head with
  `loss_parallel`, `SequenceParallel` norms with `+sp`, gradients averaged over dp by explicit
  all-reduces; compiled per block as the anchor is;
- hf (ALiBi model only): `transformers`' BloomForCausalLM of the same shape (SDPA attention where
  the installed version offers it for BLOOM, else its eager attention), trained as the anchor. All
  read random token ids and use the same loss, clipping and AdamW settings. Two kinds of rows
  (`--rows`):
- dense: sequences without documents (causal attention over the whole row);
- packed: the same random tokens in rows of packed documents, of exponential lengths with mean
  `--mean-document` tokens (700; bench/attention.py's generator, seeded per step, the same rows in
  every run), numbered 0, 1, ... per row as the pretrain stage's sampler numbers them. Ours reads
  them exactly as the pretrain stage does (`pipeline.training.heldout.micro_batches`: ((token ids,
  segment ids), labels), the ids reaching every layer's attention as `segment_ids`); the anchor
  builds FlexAttention's causal-and-same-document block mask once per micro-batch (its time counted:
  a training loop pays it) and uses it in every layer, with the ALiBi score_mod (ALiBi model) or
  none (RoPE model, FlexAttention instead of SDPA). transformers runs dense rows only. MFU counts
  the same model FLOPs per token for both kinds (attention over the full sequence, as PaLM counts
  it), so a packed row's MFU is the dense-equivalent rate: the document mask leaves about a third of
  the causal pairs at 2048 tokens. Each run warms up, then times a fixed number of optimizer steps
  between two synchronizations; MFU = model FLOPs per token
  (`pipeline.model.model_config.flops_per_token`, the same count for every role) x tokens/s / GPUs /
  the peak of `pipeline.training.loop`. The table ends in the ratios ours / anchor (issue 19's
  targets: >= 1.15 for the ALiBi model, >= 1.1 for the RoPE model) and ours / transformers, at the
  same micro-batch and global batch, and, for every layout that the tensor-parallel anchor runs,
  ours / tensor-parallel anchor at that layout (issue 57), beside our weak-scaling efficiency.

Layouts of our stack are `tp x pp x dp`; each runs in its own `torchrun` (one process per GPU, or
per rank over gloo on a CPU), as does the tensor-parallel anchor; the anchor and transformers run in
a plain process. The default is 1x1x1, plus DP on all GPUs when there are several, plus TP2 x PP2 x
DP2 when there are 8; `+sp` after a layout adds sequence parallelism. Weak scaling keeps the
per-GPU batch (micro-batch x accumulation) fixed: efficiency = tokens/s(N) / (N x tokens/s(1)), for
every layout of N GPUs. Loss agreement: before timing, every layout of ours and
the anchor train `--agree-steps` steps on the same global batches (`--agree-batch` sequences, the
same rows whatever the layout) from the same initial weights (written once per model and run with
`Transformer(cfg)`), the tensor-parallel anchor too; the table gives each run's losses and the
largest relative difference from ours at 1x1x1, so that a speed-up is not bought with another
computation.

    python bench/train.py                          # both models, micro-batch 8, on every GPU there is
    python bench/train.py --models alibi --micro-batches 4,8 --no-hf --no-anchor
    python bench/train.py --layouts 1x1x1,1x1x2 --out train.md
    python bench/train.py --smoke                  # every role on a tiny model, fp32, 2 steps (runs on a CPU)
    python bench/train.py --models alibi --rows dense,packed --no-hf --layouts 1x1x1   # issue 30's table
    python bench/train.py --models alibi --layouts 2x1x1 --no-hf --no-anchor --check-collectives --steps 1
    python bench/train.py --models alibi --layouts 1x1x1,1x1x2,2x1x1,2x1x1+sp,1x2x1 --no-hf --no-anchor
    python bench/train.py --shape 7b --layouts 1x1x1,2x1x1,4x1x1,2x1x2,2x1x1+sp   # issue 57's table
    python bench/train.py --smoke --models rope --layouts 1x1x1,2x1x1,2x1x1+sp    # TP anchor on a CPU

Our ranks' collectives, and the tensor-parallel anchor's, are bounded (`--collective-timeout`,
parallel.collective_timeout_s): a stuck one fails the run naming the rank instead of hanging;
`--check-collectives` also checks that every rank runs the same collectives
(TORCH_DISTRIBUTED_DEBUG=DETAIL), at a cost in speed, so a layout is checked in a run of its own
before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.anchor_model import AnchorModel, anchor_state_dict  # noqa: E402
from bench.attention import MEAN_DOCUMENT, packed_segment_ids  # noqa: E402
from pipeline.model.model_config import ModelConfig  # noqa: E402
from pipeline.model.model_config import flops_per_token  # noqa: E402
from pipeline.parallel.parallel_config import ParallelConfig  # noqa: E402
from pipeline.training.train_config import TrainConfig  # noqa: E402
from pipeline.training.peak_memory import peak_memory  # noqa: E402
from pipeline.training.loop import device_peak_tflops  # noqa: E402

LR = 1e-4
MODELS = {"alibi": "ALiBi model", "rope": "RoPE model"}
# ours / anchor tokens/s at the same batch: issue 19 (dense rows), issue 30 (packed rows, ALiBi
# model).
ROW_KINDS = ("dense", "packed")
TARGETS = {"dense": {"alibi": 1.15, "rope": 1.1}, "packed": {"alibi": 1.1, "rope": 1.1}}
# The model's widths and depth (--shape). 1.3b: the model of issues 19-30. The others are Llama
# shapes (grouped-query attention, SwiGLU) at the widths where tensor parallelism is used, cut to
# as many layers as keep the larger single-GPU run, the anchor, under 60 GiB of an 80 GB GPU at
# micro-batch 8 x 2048 tokens. Estimated as 16 bytes per parameter (weights, gradients, master
# weights or fp32 weights, AdamW's moments) + activations of 1.33 GiB per layer of the 1.3B RoPE
# model (ours' measured 52 GiB peak less 20 of states, BENCHMARKS.md) scaled by 6.5 x hidden + 3.5 x
# FFN (what a layer keeps for its backward) + the anchor's bf16 weight copies (2 bytes per
# parameter) and logits (16 bytes per token and vocabulary entry: 8 GiB at vocab 32768). This gives
# the 1.3B anchor 67 GiB (62 measured); ours / anchor: 7b 46 / 58 GiB, 7b-ffn11008 44 / 55, 13b
# 47 / 58, 70b 42 / 54 (one more layer: 64, 61, 66 and 74 GiB for the anchor).
SHAPES = {
    "1.3b": dict(hidden=2048, layers=24, heads=16, kv_heads=None, ffn=None, vocab=50304),
    # Llama-3-8B, Mistral-7B
    "7b": dict(hidden=4096, layers=7, heads=32, kv_heads=8, ffn=14336, vocab=32768),
    # Llama-2-7B's FFN
    "7b-ffn11008": dict(hidden=4096, layers=8, heads=32, kv_heads=8, ffn=11008, vocab=32768),
    "13b": dict(hidden=5120, layers=6, heads=40, kv_heads=8, ffn=13824, vocab=32768),
    "70b": dict(hidden=8192, layers=2, heads=64, kv_heads=8, ffn=28672, vocab=32768),
}
# The measurement on GPUs (with a --shape), and --smoke: every role end to end on a tiny model (a
# CPU is enough).
FULL = dict(
    seq_len=2048,
    init_std=0.02,
    micro_batches="8",
    hf_micro_batch=4,
    accumulation=8,
    agree_batch=16,
    agree_steps=3,
    warmup=1,
    steps=5,
    precision="bf16",
    compile=True,
)
# At the usual init (std 0.02) a tiny model's output is nearly uniform and attention barely moves
# the loss; at 0.3 an anchor without its position information (ALiBi slopes or RoPE) is off by >
# 1e-3, fp32 rounding by ~1e-7.
SMOKE = dict(
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    ffn=None,
    vocab=250,
    seq_len=32,
    init_std=0.3,
    micro_batches="2",
    hf_micro_batch=2,
    accumulation=2,
    agree_batch=4,
    agree_steps=2,
    warmup=0,
    steps=2,
    precision="fp32",
    compile=False,
)


def model_config(args) -> ModelConfig:
    """BLOOM's shape family (ALiBi) or Llama's (RoPE) at the same hidden size, depth and heads."""
    if args.model == "alibi":
        return ModelConfig(
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.heads,
            ffn_size=4 * args.hidden,
            vocab_size=args.vocab,
            position="alibi",
            norm="layernorm",
            activation="gelu",
            embedding_norm=True,
            bias=True,
            tie_embeddings=True,
            max_seq_len=args.seq_len,
            init_std=args.init_std,
        )
    # SwiGLU's three matrices of 8/3 x hidden hold as many weights as GELU's two of 4 x hidden
    # (Llama's rule).
    ffn = args.ffn or 256 * math.ceil(8 * args.hidden / 3 / 256)
    return ModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads or args.heads,
        ffn_size=ffn,
        vocab_size=args.vocab,
        position="rope",
        norm="rmsnorm",
        activation="swiglu",
        embedding_norm=False,
        bias=False,
        tie_embeddings=True,
        max_seq_len=args.seq_len,
        init_std=args.init_std,
    )


def train_config(args) -> TrainConfig:
    """Our engine's settings; the plain PyTorch roles read their optimizer, clipping and precision
    from it too."""
    return TrainConfig(
        steps=10**6,
        global_batch_size=args.agree_batch,
        micro_batch_size=args.micro,
        seq_len=args.seq_len,
        lr=LR,
        schedule="constant",
        warmup_steps=0,
        precision=args.precision,
        seed=args.seed,
    )


def write_init(cfg: ModelConfig, path: Path, seed: int) -> None:
    """The initial weights every run of the model starts from (single-model names, tied head once)."""
    from safetensors.torch import save_file

    from pipeline.model.transformer import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg)
    save_file(
        {
            name: tensor.contiguous()
            for name, tensor in model.state_dict().items()
            if name != "head.weight"
        },
        str(path),
    )


def random_rows(step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """The global batch of one step: `rows` sequences of seq_len + 1 token ids, the same in every
    run."""
    generator = torch.Generator().manual_seed(1_000_003 * step + 17)
    return torch.randint(0, vocab, (rows, seq_len + 1), generator=generator)


def document_ids(step: int, rows: int, seq_len: int, mean: int) -> torch.Tensor:
    """Segment ids of the packed rows of one step, aligned with random_rows (seq_len + 1 per row),
    the same in every run."""
    return packed_segment_ids(rows, seq_len + 1, seed=1_000_003 * step + 29, mean=mean)


def micro_batches(rows: torch.Tensor, micro: int, device):
    """(input ids, labels) per micro-batch, as DeepSpeed's pipeline engine reads them; the rows go
    to the device in one copy, as pipeline/training/heldout.py's do."""
    rows = rows.to(device)
    for start in range(0, len(rows), micro):
        window = rows[start : start + micro]
        yield window[:, :-1], window[:, 1:]


def training_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def step_batch(args, cfg, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step's rows and, for packed rows, their segment ids: the same in every run."""
    segments = (
        document_ids(step, rows, args.seq_len, args.mean_document)
        if args.row_kind == "packed"
        else None
    )
    return random_rows(step, rows, args.seq_len, cfg.vocab_size), segments


def timed(step, batches: list, warmup: int) -> tuple[float, list]:
    """Seconds for step(batch) over the batches after the first `warmup` (untimed), and every call's
    loss. The batches are made before, as a data loader has them ready: the host's time drawing
    random rows and documents is not the model's."""
    losses = [step(batch) for batch in batches[:warmup]]
    synchronize()
    start = time.perf_counter()
    losses += [step(batch) for batch in batches[warmup:]]
    synchronize()
    return time.perf_counter() - start, [float(loss) for loss in losses]


def parse_layout(layout: str) -> tuple[int, int, int, bool]:
    """`TPxPPxDP`, with `+sp` for sequence parallelism (parallel.sequence_parallel): (tp, pp, dp,
    sequence parallel)."""
    sizes, sequence_parallel = layout.removesuffix("+sp"), layout.endswith("+sp")
    tp, pp, dp = (int(x) for x in sizes.split("x"))
    return tp, pp, dp, sequence_parallel


def run_ours(args) -> dict:
    """One rank of a layout (under torchrun): agreement steps, then the timed steps; rank 0 returns
    the result."""
    import torch.distributed as dist

    from pipeline.training.engine import build_engine, init_distributed

    tp, pp, dp, sequence_parallel = parse_layout(args.layout)
    parallel = ParallelConfig(
        tp=tp,
        pp=pp,
        dp=dp,
        sequence_parallel=sequence_parallel,
        collective_timeout_s=args.collective_timeout,
    )
    init_distributed(parallel.collective_timeout_s)
    cfg = model_config(args)
    built = build_engine(cfg, train_config(args), parallel, Path(args.init), lambda name: True)
    engine = built.engine

    def step(batch: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        rows, segments = batch
        part = replica_part(len(rows), built.dp_rank, built.dp_world)
        if segments is not None:  # the pretrain stage's path from its sampler's rows to the engine
            from pipeline.training.heldout import micro_batches as packed_micro_batches

            return engine.train_batch(
                iter(
                    packed_micro_batches(
                        rows[part].numpy(), segments[part].numpy(), args.micro, engine.device
                    )
                )
            )
        return engine.train_batch(iter(micro_batches(rows[part], args.micro, engine.device)))

    result = measured(
        args,
        cfg,
        step,
        dp,
        "ours",
        "ours",
        args.layout,
        dist.get_world_size(),
        before_timing=engine.set_train_batch_size,
    )
    global_batch = result["global_batch"]
    if args.profile:
        trace = (
            f"{args.trace}/{args.layout}_{args.row_kind}.json"
            if args.trace and dist.get_rank() == 0
            else None
        )
        result["profile"] = profile_steps(
            step,
            [step_batch(args, cfg, 20_000 + i, global_batch) for i in range(args.profile)],
            trace,
        )
    dist.barrier()
    dist.destroy_process_group()
    return result


def plain_trainer(
    model: torch.nn.Module,
    logits_of,
    train: TrainConfig,
    device: torch.device,
    reduce_gradients: Callable[[], None] | None = None,
):
    """step(rows, micro): one optimizer step of a plain PyTorch model, as the HF Trainer's bf16=True
    trains (fp32 weights under bf16 autocast), with our engine's loss, clipping and AdamW (decay on
    matrices only). `reduce_gradients` runs after the last micro-batch, before clipping (the
    tensor-parallel anchor's data-parallel average)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups,
        lr=train.lr,
        betas=(train.beta1, train.beta2),
        eps=train.eps,
        fused=True if device.type == "cuda" else None,
    )
    bf16 = train.precision == "bf16"

    def step(rows: torch.Tensor, micro: int, segments: torch.Tensor | None = None) -> torch.Tensor:
        losses = []
        segments = None if segments is None else segments.to(device)
        for index, (ids, labels) in enumerate(micro_batches(rows, micro, device)):
            extra = ()
            if segments is not None:
                extra = (segments[index * micro : (index + 1) * micro, :-1],)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = logits_of(ids, *extra)
            # Ours: float32 cross-entropy of the next token at every position, averaged over the
            # micro-batches.
            loss = (
                F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
                * len(ids)
                / len(rows)
            )
            loss.backward()
            losses.append(loss.detach())
        if reduce_gradients is not None:
            reduce_gradients()
        torch.nn.utils.clip_grad_norm_(parameters, train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sum(losses)  # a tensor, or a replicated DTensor (the tensor-parallel anchor's)

    return step


def loaded_anchor(args, cfg: ModelConfig, device: torch.device, fused_qkv: bool) -> AnchorModel:
    """The plain PyTorch model on `device`, from our initial weights."""
    from safetensors.torch import load_file

    with device:
        model = AnchorModel(cfg, fused_qkv)
    model.load_state_dict(anchor_state_dict(load_file(args.init, device=str(device)), fused_qkv))
    return model


def compile_blocks(model: AnchorModel, enabled: bool) -> None:
    if enabled:
        for block in model.blocks:
            block.compile(fullgraph=True, dynamic=False)


def anchor_kernels(args, cfg: ModelConfig, device: torch.device) -> str:
    """How the anchor attends and runs, for its row's name."""
    attention = "SDPA is_causal"
    if cfg.position == "alibi":
        attention = (
            "FlexAttention + ALiBi score_mod"
            if device.type == "cuda"
            else "ALiBi score_mod as SDPA's mask (FlexAttention has no backward on a CPU)"
        )
    if args.row_kind == "packed":
        attention = (
            ("FlexAttention + ALiBi score_mod" if cfg.position == "alibi" else "FlexAttention")
            + " + document block mask"
            if device.type == "cuda"
            else "SDPA with a document mask (FlexAttention has no backward on a CPU)"
        )
    return f"{attention}, {'torch.compile per block' if args.compile else 'eager'}"


def replica_part(rows: int, replica: int, replicas: int) -> slice:
    """A data-parallel replica's equal share of a global batch of `rows` rows."""
    share = rows // replicas
    return slice(replica * share, (replica + 1) * share)


def measured(
    args,
    cfg: ModelConfig,
    step,
    dp: int,
    role: str,
    name: str,
    layout: str,
    gpus: int,
    before_timing: Optional[Callable[[int], None]] = None,
) -> dict:
    """A role's agreement steps, then its timed steps (micro x accumulation rows per replica);
    `before_timing` gets the timed global batch first (our engine is told its batch size)."""
    agree = [
        float(step(step_batch(args, cfg, i, args.agree_batch))) for i in range(args.agree_steps)
    ]
    global_batch = args.micro * args.accumulation * dp
    if before_timing is not None:
        before_timing(global_batch)
    reset_peak_memory()
    seconds, losses = timed(
        step,
        [step_batch(args, cfg, 10_000 + i, global_batch) for i in range(args.warmup + args.steps)],
        args.warmup,
    )
    result = throughput(name, layout, gpus, args, global_batch, seconds, cfg)
    result.update(
        role=role,
        agree_losses=agree,
        losses=losses,
        micro=args.micro,
        accumulation=args.accumulation,
    )
    return result


def run_anchor(args) -> dict:
    """The plain PyTorch model from our initial weights on one device: agreement steps, then the
    timed steps."""
    cfg, device = model_config(args), training_device()
    model = loaded_anchor(args, cfg, device, fused_qkv=True)
    compile_blocks(model, args.compile)
    trainer = plain_trainer(model, model, train_config(args), device)

    def step(batch: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        return trainer(batch[0], args.micro, batch[1])

    name = f"anchor: plain PyTorch, {anchor_kernels(args, cfg, device)}"
    return measured(args, cfg, step, 1, "anchor", name, single_device(device), 1)


def run_tensor_parallel_anchor(args) -> dict:
    """One rank of the plain PyTorch model at a layout of tp > 1 and pp 1 (under torchrun; DTensor
    tensor parallelism, bench/anchor_tensor_parallel.py): agreement steps, then the timed steps;
    rank 0 returns the result."""
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import loss_parallel

    from bench.anchor_tensor_parallel import (
        anchor_mesh,
        gradient_averaging,
        parallelize_anchor,
        vocab_parallel_logits,
    )
    from pipeline.parallel.ranks import bound_collectives

    tp, _, dp, sequence_parallel = parse_layout(args.layout)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = training_device()
    # Bounded as our ranks' collectives are (--collective-timeout): a stuck one fails the run.
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=bound_collectives(args.collective_timeout),
        device_id=device if device.type == "cuda" else None,
    )
    mesh, cfg = anchor_mesh(device, tp, dp), model_config(args)
    model = loaded_anchor(args, cfg, device, fused_qkv=False)
    parallelize_anchor(model, mesh, sequence_parallel)
    compile_blocks(model, args.compile)
    trainer = plain_trainer(
        model,
        vocab_parallel_logits(model, mesh),
        train_config(args),
        device,
        gradient_averaging(list(model.parameters()), mesh) if dp > 1 else None,
    )
    dp_rank, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")

    def step(batch: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        rows, segments = batch
        part = replica_part(len(rows), dp_rank, dp)
        with loss_parallel():  # the cross-entropy of logits cut by vocabulary, and its backward
            loss = trainer(rows[part], args.micro, None if segments is None else segments[part])
        # The same loss on every tensor-parallel rank; the run's is the replicas' mean.
        loss = loss.to_local()
        dist.all_reduce(loss, group=dp_group)
        return loss / dp

    name = f"anchor: plain PyTorch, tensor-parallel (DTensor), {anchor_kernels(args, cfg, device)}"
    result = measured(args, cfg, step, dp, "tp-anchor", name, args.layout, tp * dp)
    dist.barrier()
    dist.destroy_process_group()
    return result


def run_hf(args) -> dict:
    """BloomForCausalLM of the same shape on one device; on running out of memory, half the
    micro-batch, twice the accumulation (the same global batch)."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg, device = model_config(args), training_device()
    config = BloomConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        n_layer=cfg.num_layers,
        n_head=cfg.num_heads,
        layer_norm_epsilon=cfg.norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch.manual_seed(args.seed)
    try:
        model = BloomForCausalLM._from_config(config, attn_implementation="sdpa")
        attention = "sdpa"
    except (
        ValueError
    ):  # transformers has no SDPA path for BLOOM (its ALiBi is an additive bias of its own)
        model = BloomForCausalLM._from_config(config, attn_implementation="eager")
        attention = "eager"
    model = model.to(device).train()
    step = plain_trainer(
        model, lambda ids: model(input_ids=ids).logits, train_config(args), device
    )  # dense
    global_batch = args.micro * args.accumulation
    micro = args.micro
    while True:
        try:
            reset_peak_memory()
            seconds, losses = timed(
                lambda rows, micro=micro: step(rows, micro),
                [
                    random_rows(10_000 + i, global_batch, args.seq_len, cfg.vocab_size)
                    for i in range(args.warmup + args.steps)
                ],
                args.warmup,
            )
            break
        except torch.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if micro == 1:
                raise
            micro //= 2
            print(f"hf: out of memory at micro-batch {micro * 2}; trying {micro}", flush=True)
    result = throughput(
        f"transformers BloomForCausalLM ({attention})",
        single_device(device),
        1,
        args,
        global_batch,
        seconds,
        cfg,
    )
    result.update(
        role="hf", agree_losses=[], losses=losses, micro=micro, accumulation=global_batch // micro
    )
    return result


# What a run's own process measures (--role, given by `launch`); ours and the tensor-parallel
# anchor under torchrun.
ROLES = {
    "ours": run_ours,
    "anchor": run_anchor,
    "tp-anchor": run_tensor_parallel_anchor,
    "hf": run_hf,
}


def single_device(device: torch.device) -> str:
    return "1 GPU" if device.type == "cuda" else "1 CPU process"


def _peak_gib() -> float:
    """The peak device memory on a GPU, the peak resident set on a CPU (the table's one memory
    column)."""
    peaks = peak_memory()
    return peaks["host_rss_gib"] if peaks["device_gib"] is None else peaks["device_gib"]


def throughput(
    name: str, layout: str, gpus: int, args, global_batch: int, seconds: float, cfg: ModelConfig
) -> dict:
    tokens_per_s = args.steps * global_batch * args.seq_len / seconds
    tflops = flops_per_token(cfg, args.seq_len) * tokens_per_s / gpus / 1e12
    peak = device_peak_tflops()
    return {
        "name": name,
        "model": args.model,
        "rows": args.row_kind,
        "layout": layout,
        "gpus": gpus,
        "global_batch": global_batch,
        "step_s": seconds / args.steps,
        "tokens_per_s": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": None if peak is None else tflops / peak,
        "memory_gib": _peak_gib(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
        "torch": torch.__version__,
    }


# The options that a run's own process reads, passed on from the command line.
FORWARDED = (
    "hidden",
    "layers",
    "heads",
    "kv_heads",
    "ffn",
    "vocab",
    "seq_len",
    "init_std",
    "accumulation",
    "agree_batch",
    "agree_steps",
    "warmup",
    "steps",
    "seed",
    "precision",
    "compile",
    "collective_timeout",
    "mean_document",
    "profile",
    "trace",
)


def profile_steps(step, batches: list, trace: str | None = None) -> dict:
    """Rank 0's GPU kernels over step(batch) for each batch (torch.profiler): per step, the time of
    all kernels, of NCCL's, and the kernels that take most, so that a layout's communication shows
    against its computation. With `trace`, the host's operators too, written there as a Chrome trace
    (where the GPU waits for the host)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()  # on a CPU (--smoke) the operators' own CPU time stands in
    times = (
        ("self_device_time_total", "self_cuda_time_total") if on_gpu else ("self_cpu_time_total",)
    )
    activities = {ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU} | (
        {ProfilerActivity.CPU} if trace else set()
    )
    with profile(activities=list(activities)) as prof:
        for batch in batches:
            step(batch)
        synchronize()
    if trace:
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(trace)
    kernels = {}
    for event in prof.key_averages():
        if (
            on_gpu and event.device_type != DeviceType.CUDA
        ):  # the host's operators (with `trace`): not kernels
            continue
        own = next((float(getattr(event, name)) for name in times if hasattr(event, name)), 0.0)
        if own > 0:
            kernels[event.key] = kernels.get(event.key, 0.0) + own / 1000 / len(batches)
    top = sorted(kernels.items(), key=lambda item: -item[1])[:24]
    return {
        "steps": len(batches),
        "kernel_ms_per_step": sum(kernels.values()),
        "nccl_ms_per_step": sum(ms for name, ms in kernels.items() if "nccl" in name.lower()),
        "top": [[name[:90], ms] for name, ms in top],
    }


def profile_table(results: list[dict]) -> list[str]:
    lines = []
    for r in (r for r in results if r.get("profile")):
        p = r["profile"]
        lines += [
            "",
            f"Profile, {r['name']}{round_label(r)} {r['layout']} ({r.get('rows', 'dense')} rows, "
            f"rank 0, {p['steps']} steps): "
            f"{p['kernel_ms_per_step']:.1f} ms of kernels per step, of which NCCL "
            f"{p['nccl_ms_per_step']:.1f} ms "
            f"({100 * p['nccl_ms_per_step'] / max(p['kernel_ms_per_step'], 1e-9):.1f}%); step "
            f"{1000 * r['step_s']:.1f} ms",
            "",
            "| kernel | ms per step |",
            "|---|---:|",
        ]
        lines += [f"| `{name}` | {ms:.2f} |" for name, ms in p["top"]]
    return lines


def forwarded_options(args) -> list[str]:
    options = []
    for key in FORWARDED:
        value, option = getattr(args, key), key.replace("_", "-")
        if isinstance(value, bool):
            options.append(f"--{option}" if value else f"--no-{option}")
        elif value is not None:
            options.append(f"--{option}={value}")
    return options


def launch(
    args, role: str, result: Path, extra: list[str], gpus: int = 1
) -> tuple[dict | None, str]:
    """Run one measurement in fresh processes (torchrun for our layouts); its result, or the error's
    tail."""
    script = [
        str(Path(__file__).resolve()),
        f"--role={role}",
        f"--result={result}",
        *forwarded_options(args),
        *extra,
    ]
    if role in ("ours", "tp-anchor"):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            *script,
        ]
    else:
        command = [sys.executable, *script]
    env = dict(os.environ)
    if args.check_collectives:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    print("$", " ".join(command), flush=True)
    done = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    log = done.stdout
    if args.log_dir:
        Path(args.log_dir, f"{result.stem}.log").write_text(log, encoding="utf-8")
    if done.returncode != 0 or not result.exists():
        return None, log[-3000:]
    return json.loads(result.read_text(encoding="utf-8")), ""


def default_layouts(gpus: int) -> list[str]:
    layouts = ["1x1x1"]
    if gpus > 1:
        layouts.append(f"1x1x{gpus}")
    if gpus >= 8:
        layouts.append("2x2x2")
    return layouts


def summary_row(text: str, value: str) -> str:
    """A row that holds one figure, in the tokens/s column."""
    return f"| {text} | | | | | | | {value} | | | | |"


def round_label(result: dict) -> str:
    """The label of a --repeats round after the first (", round 2"); none for the first."""
    return f", round {result['round'] + 1}" if result["round"] else ""


def table(results: list[dict], failures: list[str]) -> str:
    lines = [
        (
            "| run | model | rows | layout (tp x pp x dp) | GPUs | micro x accum | global batch | "
            "tokens/s | "
            "tokens/s per GPU | TFLOP/s per GPU | MFU | peak memory (GiB) |"
        ),
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| {r['name']}{round_label(r)} | {MODELS[r['model']]} | {r.get('rows', 'dense')} | "
            f"{r['layout']} | {r['gpus']} "
            f"| {r['micro']} x {r['accumulation']} | {r['global_batch']} | "
            f"{r['tokens_per_s']:,.0f} | "
            f"{r['tokens_per_s'] / r['gpus']:,.0f} | {r['tflops_per_gpu']:.1f} | {mfu} | "
            f"{r['memory_gib']:.1f} |"
        )
    agreement = []
    kinds = sorted({r.get("rows", "dense") for r in results}, key=ROW_KINDS.index)
    for (model, label), kind in ((m, k) for m in MODELS.items() for k in kinds):
        rows = [r for r in results if r["model"] == model and r.get("rows", "dense") == kind]
        ours_single = [r for r in rows if r["role"] == "ours" and r["layout"] == "1x1x1"]
        hf = [r for r in rows if r["role"] == "hf"]
        target = TARGETS[kind][model]
        verdict = lambda ratio: f"target >= {target}: {'met' if ratio >= target else 'MISSED'}"
        for micro in sorted({r["micro"] for r in ours_single}):
            ratios = []
            for r in (r for r in ours_single if r["micro"] == micro):
                for anchor in (
                    a
                    for a in rows
                    if a["role"] == "anchor" and a["micro"] == micro and a["round"] == r["round"]
                ):
                    ratios.append(r["tokens_per_s"] / anchor["tokens_per_s"])
                    lines.append(
                        summary_row(
                            f"ratio ours (1x1x1) / anchor, {label}, {kind} rows, micro {micro}, "
                            f"global batch {r['global_batch']}{round_label(r)} "
                            f"({verdict(ratios[-1])})",
                            f"{ratios[-1]:.3f}",
                        )
                    )
            if len(ratios) > 1:
                lines.append(
                    summary_row(
                        f"median of the {len(ratios)} rounds' ratios, {label}, {kind} rows, micro "
                        f"{micro} ({verdict(statistics.median(ratios))})",
                        f"{statistics.median(ratios):.3f}",
                    )
                )
        for r in ours_single:
            for other in hf:
                lines.append(
                    summary_row(
                        f"ratio ours (1x1x1, micro {r['micro']}, global batch {r['global_batch']}) "
                        f"/ transformers (micro {other['micro']}, global batch "
                        f"{other['global_batch']}), {label}{round_label(r)}",
                        f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}",
                    )
                )
        for r in rows:
            # Every layout against as many single GPUs at the same micro-batch (issue 28's targets:
            # TP2 >= 0.80, PP2 >= 0.88, DP2 >= 0.97).
            if r["role"] == "ours" and r["gpus"] > 1:
                for base in (
                    s for s in ours_single if s["micro"] == r["micro"] and s["round"] == r["round"]
                ):
                    efficiency = r["tokens_per_s"] / (r["gpus"] * base["tokens_per_s"])
                    lines.append(
                        summary_row(
                            f"tokens/s against {r['gpus']} single GPUs, {r['layout']}, {label}, "
                            f"{kind} rows (micro {r['micro']}){round_label(r)}",
                            f"{efficiency:.3f}",
                        )
                    )
                # Against plain PyTorch's tensor parallelism on the same GPUs (issue 57).
                for anchor in (
                    a
                    for a in rows
                    if a["role"] == "tp-anchor"
                    and (a["layout"], a["micro"], a["round"])
                    == (r["layout"], r["micro"], r["round"])
                ):
                    lines.append(
                        summary_row(
                            f"ratio ours / tensor-parallel anchor, {r['layout']}, {label}, {kind} "
                            f"rows (micro {r['micro']}, global batch {r['global_batch']})"
                            f"{round_label(r)}",
                            f"{r['tokens_per_s'] / anchor['tokens_per_s']:.3f}",
                        )
                    )
        agreement += agreement_table(
            f"{label}, {kind} rows", [r for r in rows if r["agree_losses"] and r["round"] == 0]
        )
    return "\n".join(
        lines
        + agreement
        + profile_table(results)
        + [line for failure in failures for line in ("", failure)]
    )


def agreement_table(label: str, runs: list[dict]) -> list[str]:
    """Each run's agreement losses and their largest relative difference from the first run (ours at
    1x1x1 when it ran: runs are ordered ours first)."""
    if not runs:
        return []
    reference = runs[0]
    lines = [
        "",
        (
            f"Loss agreement, {label} ({len(reference['agree_losses'])} steps on the same global "
            "batches, "
            f"from the same weights):"
        ),
        "",
        (
            f"| run | layout | micro | losses | max relative difference from {reference['name']} "
            f"{reference['layout']} |"
        ),
        "|---|---|---:|---|---:|",
    ]
    for r in runs:
        diff = max(
            abs(a - b) / abs(b) for a, b in zip(r["agree_losses"], reference["agree_losses"])
        )
        losses = ", ".join(f"{loss:.5f}" for loss in r["agree_losses"])
        lines.append(f"| {r['name']} | {r['layout']} | {r['micro']} | {losses} | {diff:.2e} |")
    return lines


def describe(cfg: ModelConfig, seq_len: int) -> str:
    heads = f"{cfg.num_heads} heads" + (
        f" ({cfg.num_kv_heads} key/value)" if cfg.num_kv_heads != cfg.num_heads else ""
    )
    return (
        f"hidden {cfg.hidden_size}, {cfg.num_layers} layers, {heads}, FFN {cfg.ffn_size}, vocab "
        f"{cfg.vocab_size}, "
        f"{flops_per_token(cfg, seq_len) / 1e9:.2f} GFLOP/token"
    )


def parse_args() -> argparse.Namespace:
    def listed(preset: dict) -> str:
        return ", ".join(
            f"--{key.replace('_', '-')} {value}"
            for key, value in preset.items()
            if value is not None
        )

    shapes = "".join(f"\n  {name}: {listed(shape)}" for name, shape in SHAPES.items())
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Defaults: {listed(FULL)}.\nShapes (--shape):{shapes}\n"
        f"With --smoke: {listed(SMOKE)}.",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="defaults for a tiny model in fp32 without torch.compile, "
        "2 steps: every role end to end in a few minutes on 2 CPU cores (options given still apply)",
    )
    parser.add_argument(
        "--models",
        help="which models: alibi (BLOOM-shaped), rope (Llama-shaped), or both (the default; rope "
        "alone with a Llama --shape)",
    )
    parser.add_argument(
        "--shape",
        choices=tuple(SHAPES),
        help="the model's widths and depth (default 1.3b; the others are Llama shapes for --models "
        "rope, cut to the layers one 80 GB GPU holds; not with --smoke); the options below override",
    )
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument(
        "--kv-heads", type=int, help="key/value heads of the RoPE model (default: --heads)"
    )
    parser.add_argument(
        "--ffn",
        type=int,
        help="FFN width of the RoPE model (default: 8/3 x --hidden rounded up to 256, Llama's rule)",
    )
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--init-std", type=float, help="standard deviation of the initial weights")
    parser.add_argument(
        "--micro-batches", help="micro-batch sizes of ours and the anchor to time, e.g. 4,8"
    )
    parser.add_argument(
        "--accumulation",
        type=int,
        help="micro-batches per optimizer step and GPU (global batch = micro x this x dp)",
    )
    parser.add_argument(
        "--layouts",
        default=None,
        help="tp x pp x dp of our runs, e.g. 1x1x1,1x1x4,2x1x1+sp (+sp: "
        "with sequence parallelism) "
        "(default: 1x1x1, DP over all GPUs, and 2x2x2 on 8 GPUs)",
    )
    parser.add_argument(
        "--rows",
        default="dense,packed",
        help="row kinds: dense (no documents), packed (documents "
        "with segment ids), or both (comma-separated)",
    )
    parser.add_argument(
        "--mean-document",
        type=int,
        default=MEAN_DOCUMENT,
        help="mean document length of packed rows (tokens; exponential lengths)",
    )
    parser.add_argument("--agree-steps", type=int)
    parser.add_argument(
        "--agree-batch",
        type=int,
        help="sequences per agreement step (a multiple of micro x dp of every layout)",
    )
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=("bf16", "fp32"))
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="torch.compile the anchor's blocks"
    )
    parser.add_argument(
        "--no-anchor",
        action="store_true",
        help="leave out the plain PyTorch anchors (one GPU, and tensor-parallel at the layouts of "
        "tp > 1)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run ours and the anchor this many rounds, alternating, "
        "and report each round's ratio and their median (the anchor's figure moves by several "
        "percent from run to run)",
    )
    parser.add_argument("--no-hf", action="store_true", help="leave out the transformers anchor")
    parser.add_argument(
        "--hf-micro-batch",
        type=int,
        help="the transformers row's micro-batch (at 4 its eager "
        "attention already takes 77 GiB of an H100's 80)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=int,
        default=ParallelConfig().collective_timeout_s,
        help="seconds a collective of our ranks may wait before the run fails with an error naming "
        "the rank and the operation (parallel.collective_timeout_s)",
    )
    parser.add_argument(
        "--check-collectives",
        action="store_true",
        help="run our layouts with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective checked to be the same on all ranks "
        "first, a mismatch fails at once naming both; slower, so its timings are not the "
        "benchmark's",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        help="profile this many steps of each of our layouts "
        "after the timed ones (rank 0's kernels: computation against NCCL)",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="with --profile: write rank 0's Chrome trace (host and GPU) of "
        "each of our runs into this folder",
    )
    parser.add_argument("--log-dir", default=None, help="write each run's full output here")
    parser.add_argument("--out", default=None, help="also write the table and results (JSON) here")
    # Internal: one measurement, in the process that runs it.
    parser.add_argument("--role", choices=tuple(ROLES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=tuple(MODELS), default="alibi", help=argparse.SUPPRESS)
    parser.add_argument("--row-kind", choices=ROW_KINDS, default="dense", help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="1x1x1", help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--init", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke and args.shape:
        parser.error(
            f"--shape {args.shape} with --smoke: --smoke trains its own tiny model; drop one"
        )
    defaults = SMOKE if args.smoke else {**FULL, **SHAPES[args.shape or "1.3b"]}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    if args.role is not None:
        result = ROLES[args.role](args)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.result).write_text(json.dumps(result), encoding="utf-8")
        return

    llama_shape = args.shape not in (None, "1.3b")
    models = (args.models or ("rope" if llama_shape else "alibi,rope")).split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        sys.exit(
            f"--models: unknown {', '.join(unknown)}; allowed: {', '.join(MODELS)} "
            "(comma-separated)"
        )
    if llama_shape and "alibi" in models:
        sys.exit(
            f"--shape {args.shape} is a Llama shape (grouped-query attention, SwiGLU) for the "
            "RoPE model, not the BLOOM-shaped ALiBi one: give --models rope, or run the ALiBi "
            "model at --shape 1.3b"
        )
    row_kinds = args.rows.split(",")
    unknown = sorted(set(row_kinds) - set(ROW_KINDS))
    if unknown:
        sys.exit(
            f"--rows: unknown {', '.join(unknown)}; allowed: {', '.join(ROW_KINDS)} "
            "(comma-separated)"
        )
    gpus = torch.cuda.device_count()
    if gpus == 0 and not args.smoke:
        sys.exit(
            "bench/train.py measures bf16 training throughput on CUDA GPUs, and none is visible. "
            "`--smoke` runs every role on a tiny model on this CPU instead, to check the script "
            "end to end."
        )
    layouts = args.layouts.split(",") if args.layouts else default_layouts(gpus)
    # Where the tensor-parallel anchor runs too: tp > 1 without pipeline stages (it has none).
    tensor_parallel = [
        layout for layout in layouts if parse_layout(layout)[0] > 1 and parse_layout(layout)[1] == 1
    ]
    micros = [int(m) for m in args.micro_batches.split(",")]
    per_step = {
        (layout, micro): micro * parse_layout(layout)[2] for layout in layouts for micro in micros
    }
    uneven = [
        f"{layout} at micro {micro}"
        for (layout, micro), size in per_step.items()
        if args.agree_batch % size
    ]
    if uneven:  # else DeepSpeed fails in every rank with "Gradient accumulation steps: 0"
        sys.exit(
            f"--agree-batch {args.agree_batch} is not a multiple of micro-batch x dp for "
            f"{', '.join(uneven)}: "
            f"use a multiple of {math.lcm(*per_step.values())}."
        )
    if args.repeats < 1:
        sys.exit(f"--repeats {args.repeats}: give 1 or more rounds")
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    results, failures, shapes = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for model in models:
            args.model = model
            shapes.append(f"{MODELS[model]}: {describe(model_config(args), args.seq_len)}")
            init = Path(scratch, f"init-{model}.safetensors")
            started = time.perf_counter()
            write_init(model_config(args), init, args.seed)
            print(
                f"{model}: initial weights written in {time.perf_counter() - started:.0f} s",
                flush=True,
            )
            runs = []
            for round_index in range(
                args.repeats
            ):  # ours and the anchor alternate, round after round
                for kind in row_kinds:
                    runs += [
                        ("ours", layout, micro, kind, round_index)
                        for layout in layouts
                        for micro in micros
                    ]
                    if not args.no_anchor:
                        runs += [("anchor", "1x1x1", micro, kind, round_index) for micro in micros]
                        runs += [
                            ("tp-anchor", layout, micro, kind, round_index)
                            for layout in tensor_parallel
                            for micro in micros
                        ]
            if not args.no_hf and model == "alibi" and "dense" in row_kinds:
                runs.append(("hf", "1x1x1", args.hf_micro_batch, "dense", 0))
            for role, layout, micro, kind, round_index in runs:
                tp, pp, dp, _ = parse_layout(layout)
                world = tp * pp * dp
                if gpus and world > gpus:  # on a CPU (--smoke) the ranks are gloo processes
                    failures.append(
                        f"{role} {model} {layout}: needs {world} GPUs, this machine has {gpus}; "
                        "not run."
                    )
                    continue
                result_file = Path(
                    scratch, f"{role}-{model}-{kind}-{layout}-micro{micro}-{round_index}.json"
                )
                extra = [
                    f"--model={model}",
                    f"--layout={layout}",
                    f"--micro={micro}",
                    f"--init={init}",
                    f"--row-kind={kind}",
                ]
                started = time.perf_counter()
                result, error = launch(args, role, result_file, extra, gpus=world)
                print(
                    f"{role} {model} {kind} rows {layout} micro {micro}, round {round_index + 1}: "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
                if result is None:
                    failures.append(
                        f"{role} {model} {kind} rows {layout} micro {micro} "
                        f"FAILED:\n```\n{error}\n```"
                    )
                    print(failures[-1], flush=True)
                else:
                    results.append({**result, "round": round_index})
                    print(json.dumps(result), flush=True)
            init.unlink()
    report = table(results, failures)
    device_names = sorted({r["device"] for r in results})
    checked = (
        "; collectives checked (TORCH_DISTRIBUTED_DEBUG=DETAIL: slower)"
        if args.check_collectives
        else ""
    )
    packed_note = (
        f"; packed rows: documents of mean {args.mean_document} tokens (exponential)"
        if "packed" in row_kinds
        else ""
    )
    header = (
        f"device: {', '.join(device_names) or '?'} x{max(gpus, 1)}; seq {args.seq_len}, "
        f"{args.precision}{checked}"
        f"{packed_note}; "
        f"{'; '.join(shapes)}; "
        f"{args.steps} timed steps after {args.warmup} warm-up steps"
        f"{f'; {args.repeats} rounds, ours and the anchor alternating' if args.repeats > 1 else ''}"
    )
    print("\n" + header + "\n\n" + report)
    if args.out:
        Path(args.out).write_text(
            header + "\n\n" + report + "\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
