"""Memory of one rank of the training engine, term by term, from the model's shape and the layout
(in bytes).

What is counted is what pipeline/training/engine.py builds (DeepSpeed's PipelineEngine, ZeRO-1 over
the data-parallel group) and what autograd keeps for the backward of pipeline/model/transformer.py.
Symbols: b micro-batch, s sequence length, h hidden size, a and g query and key/value heads, d head
size, f FFN width, t = tp, e bytes per value (2 in bf16, 4 in fp32), P the rank's parameters (P_T
those it trains).

- weights e·P; gradients e·P_T (`param.grad`, summed over the step's micro-batches);
- optimizer 12·P_T/dp: fp32 master weights and Adam's two moments, ZeRO-1 partitions over dp;
- activations per block and micro-batch, saved for the backward: the residual stream and the norms'
  outputs are whole on every tensor-parallel rank (no sequence parallelism), the rest is cut by t:
  flash (Triton) e·b·s·(4h + (3a + 2g)·d/t + c·f/t) + 4·b·s·a/t, with c = 4 for SwiGLU, 2 for GELU:
  the norms' inputs and outputs, q, k, v, the attention output and its reshaped copy, the MLP's
  intermediates and the kernel's float32 log-sum-exp; no s x s matrix. The PyTorch reference (CPU)
  keeps the float32 softmax 4·b·s²·a/t and the mask b·s², q, k, v in float32 at a/t heads, and
  RMSNorm's normalised input besides;
- the first stage holds `pp` micro-batches in flight, stage i `pp - i` (at most the accumulation
  steps m); with activation checkpointing every k blocks a recomputed chunk keeps only its input
  e·b·s·h, and the backward recomputes one chunk at a time;
- the last stage keeps the logits e·b·s·V/t of up to two micro-batches (DeepSpeed's pipeline
  buffers) and the loss works on about 12 bytes per logit in float32 (log-probabilities and two
  gradients). Where the engine fuses the head with the loss (HEAD_FUSED_WITH_LOSS), the buffers keep
  the head's input e·b·s·h instead, and the loss saves the gradients of that input and of the head's
  weight e·V·h/t, which its backward scales into new tensors; only a chunk of the logits exists at a
  time;
- buffers: ZeRO's gradient-reduction bucket of 5e8 values (allocated at the first gradient of every
  backward and for the reduction at the end of the step) and the pipeline's send/receive tensors of
  e·b·s·h (cut by t when tp > 1).

A rank's peak is the largest of three moments: the backward (activations, full gradients), the
gradient reduction (gradients and the bucket) and the optimizer step (the reduction's copy of the
rank's gradient partition, a flat e and an fp32 copy of it, and on a CPU the unfused AdamW's two
fp32 temporaries). CPU ranks count only written memory, as the process's resident set does: the
bucket costs what is written into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.memory_fit.layout import Layout, blocks_per_stage
from pipeline.model.model_config import (
    ModelConfig,
    gated,
    norms_per_block,
    qk_norm_parameters,
)

# DeepSpeed's ZeRO default `reduce_bucket_size` (the engine does not set it), in values.
REDUCE_BUCKET = 500_000_000
# float32 bytes per logit of the loss's working set: log-probabilities (or the logits a
# vocab-parallel loss saves) and two gradients of that size alive at once in its backward.
LOSS_BYTES_PER_LOGIT = 12
# Whether the engine's last pipeline layer hands the hidden states and the head's weight to a loss
# that applies the head itself, a chunk of rows at a time (pipeline/kernels/fused_head.py);
# tests/unit/memory_fit/test_plan.py checks that this says what pipeline/parallel/pipeline_model.py
# does.
HEAD_FUSED_WITH_LOSS = True
# Logits per chunk of that fused loss (pipeline/kernels/fused_head.py: CHUNK_LOGIT_ELEMENTS; the
# planner stays torch-free, so tests/unit/memory_fit/test_plan.py checks that the two agree).
FUSED_LOSS_CHUNK_LOGITS = 1024 * 131072


@dataclass(frozen=True)
class Numerics:
    """How the engine computes on a device."""

    # 2: bf16 weights and activations, 4: fp32.
    value_bytes: int
    # The Triton kernels (FlashAttention, norms); False: the PyTorch references, which build s x s
    # matrices.
    flash: bool
    # CPU ranks: memory counts the pages written (the resident set), not what is reserved.
    host: bool


@dataclass(frozen=True)
class StageMemory:
    """One rank of pipeline stage `stage` (every tensor- and data-parallel rank of a stage holds the
    same)."""

    stage: int
    blocks: int
    parameters: int
    weights: int
    gradients: int
    optimizer: int
    # At the backward's peak: the micro-batches in flight and the working set of the backward.
    activations: int
    # Last stage: what the LM head and the loss hold: the logits (or the head's input) the pipeline
    # keeps, and the loss's working set.
    loss: int
    # The gradient-reduction bucket and the pipeline's send/receive tensors.
    buffers: int
    peak: int
    # When the peak happens: backward, gradient reduction or optimizer step.
    phase: str
    # What stays allocated between optimizer steps: weights, optimizer state, and what the
    # pipeline's buffers keep (the last layer's output, the send/receive tensors).
    between_steps: int


def vocab_shard(model: ModelConfig, tp: int) -> int:
    """Vocabulary rows of one tensor-parallel rank: the padded vocabulary in tp equal multiples of
    the padding."""
    parts = tp * model.pad_vocab_multiple
    return -(-model.padded_vocab_size // parts) * model.pad_vocab_multiple


def _norm_parameters(model: ModelConfig) -> int:
    return model.hidden_size * (2 if model.norm == "layernorm" and model.bias else 1)


def block_parameters(model: ModelConfig, tp: int) -> int:
    """One block's parameters on a tensor-parallel rank: column/row-parallel matrices and their
    biases cut by tp, q/k norms over all heads too; the other norms, per-head q/k norms and the
    row-parallel layers' biases whole."""
    h, d, f = model.hidden_size, model.head_dim, model.ffn_size // tp
    heads, kv_heads = model.num_heads // tp, model.num_kv_heads // tp
    gated_mlp = gated(model)
    attention = h * d * (2 * heads + 2 * kv_heads)
    mlp = (3 if gated_mlp else 2) * h * f
    qkv_biases = d * (heads + 2 * kv_heads) if model.bias or model.qkv_bias else 0
    biases = h + f * (2 if gated_mlp else 1) + h if model.bias else 0
    return (
        attention
        + mlp
        + qkv_biases
        + biases
        + norms_per_block(model) * _norm_parameters(model)
        + qk_norm_parameters(model, tp)
    )


def stage_parameters(model: ModelConfig, tp: int, pp: int, stage: int) -> tuple[int, int]:
    """(held, trained) parameters of a rank of pipeline stage `stage`. With tied embeddings and pp >
    1 the last stage holds its own copy of the embedding, of which it trains only the matrix."""
    blocks = blocks_per_stage(model.num_layers, pp)[stage]
    vocab = vocab_shard(model, tp) * model.hidden_size
    embedding_norm = _norm_parameters(model) if model.embedding_norm else 0
    held = trained = blocks * block_parameters(model, tp)
    if stage == 0:
        held += vocab + embedding_norm
        trained += vocab + embedding_norm
    if stage == pp - 1:
        held += _norm_parameters(model)
        trained += _norm_parameters(model)
        if not model.tie_embeddings:
            held += vocab
            trained += vocab
        elif pp > 1:
            held += vocab + embedding_norm
            trained += vocab
    return held, trained


def _norm_activations(model: ModelConfig, rows: int, nx: Numerics) -> int:
    """What one norm saves of a (rows, h) input besides its output: the input (float32 in the
    reference) and its statistics; the reference RMSNorm also its float32 normalised input."""
    h = model.hidden_size
    stats = 4 * rows * (1 if model.norm == "rmsnorm" else 2)
    if nx.flash:
        return nx.value_bytes * rows * h + stats
    normalised = 4 * rows * h if model.norm == "rmsnorm" else 0
    return 4 * rows * h + normalised + stats


def block_activations(
    model: ModelConfig, micro_batch: int, seq_len: int, tp: int, nx: Numerics
) -> int:
    """Bytes one block keeps for its backward per micro-batch on a tensor-parallel rank."""
    b, s, e = micro_batch, seq_len, nx.value_bytes
    rows, h, d = b * s, model.hidden_size, model.head_dim
    heads, kv_heads, ffn = model.num_heads // tp, model.num_kv_heads // tp, model.ffn_size // tp
    # each input norm's output feeds a linear layer; the output norms' (Gemma's) the residual sum
    norms = 2 * (_norm_activations(model, rows, nx) + e * rows * h)
    if model.norm_placement == "both":
        norms += 2 * _norm_activations(model, rows, nx)
    if nx.flash:
        # q, k, v, the output and the float32 log-sum-exp (the int32 copy of the segment ids is made
        # once per batch and shared by the layers: pipeline/kernels/attention.py). The kernels lay
        # the output out as the projections are, so the output projection reads it as it is, with no
        # copy of its own.
        attention = e * rows * d * (2 * heads + 2 * kv_heads) + 4 * rows * heads
    else:
        # float32 q and k, v repeated to every query head, the softmax, the causal/document mask,
        # and the output made contiguous for the output projection.
        attention = 4 * b * heads * s * (3 * d + s) + b * s * s + e * rows * heads * d
    if model.position == "rope":
        attention += 2 * e * s * d  # the rotation's cos and sin
    if model.qk_norm != "none":
        # The q and k norms keep their inputs (float32, and the normalised values, in the
        # reference) and a float32 statistic per head (`head`) or per token (`full`) and norm.
        width = rows * d * (heads + kv_heads)
        statistics = rows * (heads + kv_heads if model.qk_norm == "head" else 2)
        attention += (e if nx.flash else 8) * width + 4 * statistics
    mlp = e * rows * ffn * (4 if gated(model) else 2)
    return norms + attention + mlp


def _backward_working_set(
    model: ModelConfig, micro_batch: int, seq_len: int, tp: int, nx: Numerics
) -> int:
    """What one block's backward holds beyond its saved activations at its fullest: in the MLP two
    gradients of e·b·s·f/t (SwiGLU's product; one for GELU) and two of the residual stream; in the
    reference attention the softmax's two s x s gradients, less the MLP's activations that its
    backward has already freed."""
    rows, e = micro_batch * seq_len, nx.value_bytes
    ffn, heads = model.ffn_size // tp, model.num_heads // tp
    gated_mlp = gated(model)
    mlp = e * rows * (ffn * (2 if gated_mlp else 1) + 2 * model.hidden_size)
    if nx.flash:
        return mlp
    freed = e * rows * ffn * (4 if gated_mlp else 2)
    return max(mlp, 2 * 4 * micro_batch * heads * seq_len * seq_len - freed)


def _chunks(stage_layers: list[bool], interval: int) -> list[list[bool]]:
    """The stage's layers (True: a block) cut as DeepSpeed's PipelineModule checkpoints them: runs
    of `interval`; the project recomputes a run only if it holds nothing but blocks
    (pipeline_model.TransformerPipeline)."""
    if interval == 0:
        return [stage_layers]
    return [stage_layers[i : i + interval] for i in range(0, len(stage_layers), interval)]


def _head_and_loss(model: ModelConfig, layout: Layout, nx: Numerics) -> tuple[int, int]:
    """(kept, working): what DeepSpeed's pipeline buffers keep of the last layer's output (up to two
    micro-batches, one when a step has one), and what the head and the loss hold at once besides."""
    e, rows = nx.value_bytes, layout.micro_batch * layout.seq_len
    shard = vocab_shard(model, layout.tp)
    buffers = 1 if layout.accumulation == 1 else 2
    if not HEAD_FUSED_WITH_LOSS:
        return (
            buffers * e * rows * shard,
            LOSS_BYTES_PER_LOGIT * rows * (model.vocab_size if layout.tp == 1 else shard),
        )
    head_gradients = e * rows * model.hidden_size + e * shard * model.hidden_size
    chunk_logits = min(rows, max(1, FUSED_LOSS_CHUNK_LOGITS // shard)) * shard
    # A CPU takes a chunk's log-sum-exp with torch's logsumexp, which holds a float32 copy of the
    # chunk besides.
    chunk = e * chunk_logits + (4 * chunk_logits if nx.host else 0)
    return buffers * e * rows * model.hidden_size, max(head_gradients + chunk, 2 * head_gradients)


def _saved_activations(
    model: ModelConfig, layout: Layout, nx: Numerics, stage: int, interval: int
) -> tuple[int, int]:
    """(saved, recompute): what a rank of `stage` keeps for the backward per micro-batch in flight,
    with activation checkpointing every `interval` blocks, and the largest chunk of blocks the
    backward recomputes at once."""
    tp, e = layout.tp, nx.value_bytes
    b, s = layout.micro_batch, layout.seq_len
    first, last = stage == 0, stage == layout.pp - 1
    blocks = blocks_per_stage(model.num_layers, layout.pp)[stage]
    rows_h = b * s * model.hidden_size
    # The blocks (whole, or a recomputed chunk's input), then the layers around them.
    layers = [False] * (1 if first else 0) + [True] * blocks + [False] * (2 if last else 0)
    one_block = block_activations(model, b, s, tp, nx)
    saved, recompute = 0, 0
    for chunk in _chunks(layers, interval):
        if interval and all(chunk):
            saved += e * rows_h
            recompute = max(recompute, len(chunk) * one_block)
        else:
            saved += chunk.count(True) * one_block
    if first and model.embedding_norm:
        saved += _norm_activations(model, b * s, nx)
    if last:  # the final norm's input, and its output where the head (a linear layer) saves it
        saved += _norm_activations(model, b * s, nx) + (0 if HEAD_FUSED_WITH_LOSS else e * rows_h)
    # the stage's output, kept until its gradient comes back (a tensor-parallel rank keeps its 1/tp
    # share)
    else:
        saved += e * rows_h // tp
    return saved, recompute


def _p2p_buffers(model: ModelConfig, layout: Layout, nx: Numerics, stage: int) -> int:
    """The pipeline's send/receive tensors on a rank of `stage` (none without pipeline
    parallelism)."""
    if layout.pp == 1:
        return 0
    tp, e = layout.tp, nx.value_bytes
    rows_h = layout.micro_batch * layout.seq_len * model.hidden_size
    # What travels between stages: 1/tp of it under tensor parallelism.
    message = e * rows_h // tp
    p2p = 0
    if stage != 0:
        # The receive buffer; at tp=1 the pipeline also keeps each received input (>= 2 buffers).
        p2p += message + (max(2, layout.in_flight(stage)) * e * rows_h if tp == 1 else 0)
    if stage != layout.pp - 1:  # the receive buffer of the output's gradient
        p2p += message
    return p2p


def _reduction_bucket(nx: Numerics, partition: int) -> int:
    """ZeRO-1's gradient-reduction bucket, for a rank's gradient partition of `partition` values."""
    # ZeRO-1 allocates its bucket at the first gradient of every backward and again for the
    # reduction. A CPU process's resident set grows only by what is written into it: a copy of the
    # rank's gradient partition.
    return nx.value_bytes * partition if nx.host else nx.value_bytes * REDUCE_BUCKET


def _optimizer_step(nx: Numerics, partition: int) -> int:
    """What the optimizer step holds besides the weights and optimizer state, for a rank's gradient
    partition of `partition` values."""
    e = nx.value_bytes
    # The optimizer step, one parameter group after another, first flattens the group's gradients
    # (e) and casts them to fp32 (a new tensor unless they are fp32 already), then updates it,
    # torch's unfused AdamW on a CPU with two temporaries of its size (fused on a GPU: none). All
    # the while the gradient partition that the reduction copied them into stays whole: the groups
    # share it.
    flatten = e * partition + (4 * partition if e != 4 else 0)
    update = 4 * partition + (8 * partition if nx.host else 0)
    return e * partition + max(flatten, update)


def stage_memory(
    model: ModelConfig,
    layout: Layout,
    nx: Numerics,
    stage: int,
    checkpoint_interval: int | None = None,
) -> StageMemory:
    """The memory of a rank of `stage`; `checkpoint_interval` replaces the layout's (to show the
    alternative)."""
    interval = layout.checkpoint_interval if checkpoint_interval is None else checkpoint_interval
    tp, dp, e = layout.tp, layout.dp, nx.value_bytes
    last = stage == layout.pp - 1
    blocks = blocks_per_stage(model.num_layers, layout.pp)[stage]
    held, trained = stage_parameters(model, tp, layout.pp, stage)
    weights, gradients, optimizer = e * held, e * trained, 12 * trained // dp

    saved, recompute = _saved_activations(model, layout, nx, stage, interval)
    working = recompute + _backward_working_set(model, layout.micro_batch, layout.seq_len, tp, nx)
    kept, loss_working = _head_and_loss(model, layout, nx) if last else (0, 0)
    # The loss runs backward before any block does: the larger of the two working sets counts.
    activations = layout.in_flight(stage) * saved + working
    loss = kept + max(loss_working - working, 0)

    p2p = _p2p_buffers(model, layout, nx, stage)
    partition = trained // dp
    bucket = _reduction_bucket(nx, partition)
    static = weights + optimizer + p2p + kept
    phases = {
        "backward": weights
        + optimizer
        + p2p
        + gradients
        + activations
        + loss
        + (0 if nx.host else bucket),
        "gradient reduction": static + gradients + bucket,
        "optimizer step": static + _optimizer_step(nx, partition),
    }
    phase = max(phases, key=phases.get)
    return StageMemory(
        stage=stage,
        blocks=blocks,
        parameters=held,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        loss=loss,
        buffers=p2p + bucket,
        peak=phases[phase],
        phase=phase,
        between_steps=static,
    )
