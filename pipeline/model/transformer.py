"""A decoder-only transformer: embedding -> blocks -> final norm -> head.

Each part is a plain nn.Module that runs on its own (so that pipeline parallelism can place them on
different stages, and the warm start can replace or freeze the embedding and head). Every block
carries its own position information (RoPE frequencies or ALiBi slopes, computed on the fly in
float32), and calls the attention kernel API of `pipeline.kernels`.

Where a token is: ALiBi slopes (BLOOM) and rotary embeddings (Llama, Mistral, Qwen, OLMo 2, Phi-3,
Gemma).

Both follow the published checkpoints' conventions so that weights map 1:1: ALiBi slopes as BLOOM
computes them, RoPE rotating the two halves of each head (transformers' `rotate_half`, not
interleaved pairs), with frequencies (and their scalings: llama3, linear, yarn, longrope) and angles
in float32 as transformers computes them, operation for operation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.kernels import (
    add_layer_norm,
    add_rms_norm,
    apply_rope,
    flash_attention,
    layer_norm,
    rms_norm,
    rotate_stacked_qkv,
    stacked_flash_attention,
    unstack_qkv,
)
from pipeline.model.model_config import ModelConfig, RopeScaling, gated


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if unit_offset else torch.ones(size))
        self.eps = eps
        self.unit_offset = unit_offset

    def applied_weight(self) -> torch.Tensor:
        """The weight as the norm applies it (a sequence-parallel norm routes its gradient through
        the ranks)."""
        return self.scale(self.weight)

    def scale(self, weight: torch.Tensor) -> torch.Tensor:
        """What the normalised values are multiplied by: the weight, or 1 + weight in float32 for
        weights stored as offsets from one (Gemma, model.norm_unit_offset)."""
        return 1.0 + weight.float() if self.unit_offset else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 (bf16 sums of squares lose too much); the Triton kernel on a GPU.
        return rms_norm(x, self.applied_weight(), self.eps)

    def add_forward(
        self, x: torch.Tensor, addend: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + addend, its norm) in one pass."""
        return add_rms_norm(x, addend, self.applied_weight(), self.eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same `weight`/`bias` parameters, `bias=False` allowed) run by the Triton kernel
    on a GPU."""

    def applied_weights(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Weight and bias as the norm applies them (see RMSNorm.applied_weight)."""
        return self.weight, self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, *self.applied_weights(), self.eps)

    def add_forward(
        self, x: torch.Tensor, addend: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + addend, its norm) in one pass."""
        return add_layer_norm(x, addend, *self.applied_weights(), self.eps)


def make_norm(cfg: ModelConfig, size: Optional[int] = None) -> nn.Module:
    """A norm of the model's kind over `size` values (default: hidden_size)."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(size or cfg.hidden_size, cfg.norm_eps, cfg.norm_unit_offset)
    return LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


def stacked_parameter_grads(
    grad: torch.Tensor,
    tokens: torch.Tensor,
    weights: list[torch.Tensor],
    has_bias: bool,
    wanted: tuple[bool, ...],
) -> list[Optional[torch.Tensor]]:
    """Weight and bias gradients of linear layers run as one over their stacked weights
    (`_StackedLinears`, and the column-parallel layers): `grad` (tokens, stacked outputs) and
    `tokens` (tokens, inputs) in 2-D; `wanted` says per layer whether its weight and its bias need
    one. Returns them in that order, None where not wanted."""
    sizes = [weight.shape[0] for weight in weights]
    grad_weights = (grad.t() @ tokens).split(sizes) if any(wanted[0::2]) else (None,) * len(sizes)
    grad_biases = (
        grad.sum(0).split(sizes) if has_bias and any(wanted[1::2]) else (None,) * len(sizes)
    )
    grads = []
    for index, (grad_weight, grad_bias) in enumerate(zip(grad_weights, grad_biases)):
        grads += [
            grad_weight if wanted[2 * index] else None,
            grad_bias if wanted[2 * index + 1] else None,
        ]
    return grads


class _StackedLinears(torch.autograd.Function):
    """Linear layers that read the same x (q, k, v; gate, up) as one matrix product over their
    weights stacked; the stack is built again in the backward rather than kept between the passes.
    The backward's gradient of x is then one product too, instead of one per layer and the additions
    of their results."""

    @staticmethod
    def forward(ctx, x, *weights_and_biases):
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.save_for_backward(x, *weights)
        ctx.has_bias = biases[0] is not None
        return F.linear(x, torch.cat(weights), torch.cat(biases) if ctx.has_bias else None)

    @staticmethod
    def backward(ctx, grad):
        x, *weights = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x = (grad @ torch.cat(weights)).view(x.shape) if ctx.needs_input_grad[0] else None
        return grad_x, *stacked_parameter_grads(
            grad, x.reshape(-1, x.shape[-1]), weights, ctx.has_bias, ctx.needs_input_grad[1:]
        )


def stacked_linears(x: torch.Tensor, layers: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The outputs of linear layers that all read x, side by side along the last axis, from one
    matrix product."""
    parameters = [tensor for layer in layers for tensor in (layer.weight, layer.bias)]
    return _StackedLinears.apply(x, *parameters)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        # This layer's window (None: the whole sequence), and whether it rotates with the windowed
        # layers' own RoPE base (Gemma 3's local layers).
        self.window = cfg.layer_window(layer)
        self.local_rope = self.window is not None and cfg.rope_local_theta is not None
        head_dim, qkv_bias = cfg.head_dim, cfg.bias or cfg.qkv_bias
        self.q = nn.Linear(cfg.hidden_size, cfg.num_heads * head_dim, bias=qkv_bias)
        self.k = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * head_dim, bias=qkv_bias)
        self.v = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * head_dim, bias=qkv_bias)
        self.out = nn.Linear(cfg.num_heads * head_dim, cfg.hidden_size, bias=cfg.bias)
        # Queries and keys normalised before RoPE: per head with one shared weight (Qwen3), or
        # over all heads at once (OLMo 2).
        if cfg.qk_norm == "head":
            self.q_norm, self.k_norm = make_norm(cfg, head_dim), make_norm(cfg, head_dim)
        elif cfg.qk_norm == "full":
            self.q_norm = make_norm(cfg, cfg.num_heads * head_dim)
            self.k_norm = make_norm(cfg, cfg.num_kv_heads * head_dim)
        else:
            self.q_norm = self.k_norm = None

    def alibi_slopes(self, device: torch.device) -> torch.Tensor:
        """The ALiBi slope of each of this module's query heads."""
        return shared_alibi_slopes(self.cfg.num_heads, device)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """q, k and v of every token side by side: (batch, seq, (heads + 2 kv_heads) x head_dim)."""
        return stacked_linears(x, (self.q, self.k, self.v))

    def forward(self, x: torch.Tensor, segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        cfg = self.cfg
        qkv = self.project(x)
        # The shapes follow the projection: a tensor-parallel rank holds a slice of the heads (and,
        # with sequence parallelism, x only a part of the tokens).
        batch, seq, width = qkv.shape
        heads = width // cfg.head_dim * cfg.num_heads // (cfg.num_heads + 2 * cfg.num_kv_heads)
        # A window as long as the sequence changes nothing, and the kernels run faster without.
        window = self.window if self.window is not None and self.window < seq else None
        options = dict(
            causal=True,
            segment_ids=segment_ids,
            softmax_scale=cfg.softmax_scale,
            sliding_window=window,
            softcap=cfg.attention_softcap,
        )
        if cfg.position != "rope":
            y = stacked_flash_attention(
                qkv, heads, cfg.head_dim, alibi_slopes=self.alibi_slopes(x.device), **options
            )
            return self.out(y.transpose(1, 2).reshape(batch, seq, -1))
        # Positions count from the start of the sequence, also in packed sequences (documents after
        # the first do not start at 0); segment_ids only keep documents apart.
        cos, sin = shared_rope_tables(cfg, seq, qkv.dtype, qkv.device, self.local_rope)
        if self.q_norm is None:
            # q and k rotated where the projection left them: one pass, and one gradient tensor
            # from the attention (no copies into and out of separate q, k and v).
            rotated = rotate_stacked_qkv(qkv, heads, cfg.head_dim, cos, sin)
            y = stacked_flash_attention(rotated, heads, cfg.head_dim, **options)
        else:
            q, k, v = unstack_qkv(qkv, heads, cfg.head_dim)
            q, k = self.normed(q, self.q_norm), self.normed(k, self.k_norm)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            # v copied out of the stack: attention saves v, and a view would keep the unrotated q
            # and k alive too.
            y = flash_attention(q, k, v.contiguous(), **options)
        return self.out(y.transpose(1, 2).reshape(batch, seq, -1))

    def normed(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """q or k (batch, heads, seq, head_dim) through its norm: each head's values (`head`), or all
        of a token's heads side by side (`full`; under tensor parallelism, this rank's heads)."""
        if self.cfg.qk_norm == "head":
            return norm(x)
        batch, heads, seq, head_dim = x.shape
        flat = x.transpose(1, 2).reshape(batch, seq, heads * head_dim)
        return norm(flat).view(batch, seq, heads, head_dim).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.activation = cfg.activation
        self.gated = gated(cfg)
        if self.gated:
            self.gate = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the activation reads: gate and up (SwiGLU, GeGLU; one product, then views), or up
        alone."""
        return (
            stacked_linears(x, (self.gate, self.up)).chunk(2, dim=-1)
            if self.gated
            else (self.up(x),)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            gate, up = self.project(x)
            return self.down(F.silu(gate) * up)
        # BLOOM's and Gemma's GELU are the tanh approximation.
        if self.activation == "geglu":
            gate, up = self.project(x)
            return self.down(F.gelu(gate, approximate="tanh") * up)
        (up,) = self.project(x)
        return self.down(F.gelu(up, approximate="tanh"))


class Block(nn.Module):
    """x + attn(attn_norm(x)), then the same with the MLP; with `model.norm_placement=post` (OLMo 2)
    the norms take the sublayers' outputs instead: x + attn_norm(attn(x)); with `both` (Gemma) the
    sublayers' outputs have norms of their own too: x + attn_out_norm(attn(attn_norm(x)))."""

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.post_norms = cfg.norm_placement == "post"
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = make_norm(cfg)
        self.mlp = MLP(cfg)
        if cfg.norm_placement == "both":
            self.attn_out_norm, self.mlp_out_norm = make_norm(cfg), make_norm(cfg)
        else:
            self.attn_out_norm = self.mlp_out_norm = None

    def forward(self, x: torch.Tensor, segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x, mlp_out = self.residual_parts(x, segment_ids)
        return x + mlp_out

    def residual_parts(
        self,
        x: torch.Tensor,
        segment_ids: Optional[torch.Tensor] = None,
        owed: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's residual stream and its MLP's output, not yet added to it: the next block
        adds that inside its first norm, as this one adds `owed` (the previous block's) and its
        attention's output inside its norms. Each addition is then one pass over the activations,
        and so is its gradient's in the backward. (With norms after the sublayers, the additions
        come after the norms, and the owed output is the MLP's normalised.)"""
        if self.post_norms:
            if owed is not None:
                x = x + owed
            x = x + self.attn_norm(self.attn(x, segment_ids))
            return x, self.mlp_norm(self.mlp(x))
        if owed is None:
            normed = self.attn_norm(x)
        else:
            x, normed = self.attn_norm.add_forward(x, owed)
        attn_out = self.attn(normed, segment_ids)
        if self.attn_out_norm is not None:
            attn_out = self.attn_out_norm(attn_out)
        x, normed = self.mlp_norm.add_forward(x, attn_out)
        mlp_out = self.mlp(normed)
        return x, mlp_out if self.mlp_out_norm is None else self.mlp_out_norm(mlp_out)


class Embedding(nn.Module):
    """Token ids -> vectors, with BLOOM's LayerNorm after the lookup, or Gemma's scaling by
    sqrt(hidden_size), when configured."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # nn.Embedding's own Normal(0, 1) init, except on the meta device (model_shapes), where
        # torch's normal_ imports torch._dynamo (3 s) to draw nothing
        weight = torch.empty(cfg.padded_vocab_size, cfg.hidden_size)
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size, _weight=weight)
        self.norm = make_norm(cfg) if cfg.embedding_norm else None
        self.scale = cfg.hidden_size**0.5 if cfg.embedding_scale else None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids)
        if self.scale is not None:
            # rounded to the activations' dtype first, as Gemma's checkpoints were trained
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x if self.norm is None else self.norm(x)


class Head(nn.Linear):
    """Vectors -> logits over the real vocabulary (the padding rows are never predicted), capped to
    c * tanh(logit / c) with model.logit_softcap c (Gemma 2)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.vocab_size = cfg.vocab_size
        self.softcap = cfg.logit_softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)[..., : self.vocab_size]
        return logits if self.softcap is None else cap_logits(logits, self.softcap)


def cap_logits(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """c * tanh(logits / c), in transformers' order of operations."""
    return torch.tanh(logits / softcap) * softcap


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.num_layers))
        self.final_norm = make_norm(cfg)
        self.head = Head(cfg)
        self.reset_parameters()

    def tie_weights(self) -> None:
        """Make the head use the embedding matrix (after either was replaced or loaded)."""
        if self.cfg.tie_embeddings:
            self.head.weight = self.embedding.tokens.weight

    def reset_parameters(self) -> None:
        """Every tensor as `initialise` draws it (from the global generator, in the model's order)."""
        for name, parameter in self.named_parameters():
            initialise(self.cfg, name, parameter)
        self.tie_weights()

    def forward(
        self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab_size) for token ids (batch, seq); segment_ids (batch, seq) keep
        packed documents from attending to each other."""
        return self.head(self.hidden_states(input_ids, segment_ids))

    def hidden_states(
        self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """The last hidden states (batch, seq, hidden_size), after the final norm: what the head
        reads (and what Hugging Face models return last with output_hidden_states=True)."""
        x, owed = self.embedding(input_ids), None
        for block in self.blocks:
            x, owed = block.residual_parts(x, segment_ids, owed)
        return self.final_norm.add_forward(x, owed)[1]


# The tensors with one row per vocabulary entry, padded to `pad_vocab_multiple` rows.
VOCAB_TENSORS = ("embedding.tokens.weight", "head.weight")


@torch.no_grad()
def initialise(
    cfg: ModelConfig, name: str, tensor: torch.Tensor, generator: Optional[torch.Generator] = None
) -> None:
    """A new model's tensor `name`: Normal(0, init_std) weights, zero biases, unit norms (zero where
    they are stored as offsets from one); zero padding rows.

    The projections that write into the residual stream (attention out, MLP down) get init_std /
    sqrt(2 * num_layers), as in GPT-2 and Megatron, so the stream's variance does not grow with
    depth.
    """
    if (
        tensor.is_meta
    ):  # shapes only (model_shapes): no values to draw, and torch's meta normal_ takes 15 ms a call
        return
    std = cfg.init_std
    if name.endswith("bias"):
        tensor.zero_()
    elif tensor.dim() == 1:
        tensor.fill_(0.0 if cfg.norm_unit_offset and cfg.norm == "rmsnorm" else 1.0)
    elif name.endswith(("attn.out.weight", "mlp.down.weight")):
        tensor.normal_(0.0, std / math.sqrt(2 * cfg.num_layers), generator=generator)
    else:
        tensor.normal_(0.0, std, generator=generator)
    if name in VOCAB_TENSORS:
        tensor[cfg.vocab_size :].zero_()


def alibi_slopes(num_heads: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """One slope per head, for all heads (tensor parallelism slices its ranks' share).

    For a power of two n the slopes are 2^(-8k/n), k = 1..n (Press et al. 2022). For other counts,
    BLOOM takes the slopes of the closest smaller power of two p and adds every other slope of 2p.
    """

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=16)
def shared_alibi_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    """`alibi_slopes` made once per device and shared by the layers (not to be modified): made per
    layer, each forward copied them from the host, which waits for the device's queue."""
    return alibi_slopes(num_heads, device)


def shared_rope_tables(
    cfg: ModelConfig, seq_len: int, dtype: torch.dtype, device: torch.device, local: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_cos_sin` made once per shape, dtype and device and shared by the layers (not to be
    modified): made per layer, they cost every forward a dozen small launches per layer. `local`:
    the windowed layers' own base, unscaled (model.rope_local_theta)."""
    if local:
        return _rope_tables(cfg.head_dim, cfg.rope_local_theta, None, seq_len, dtype, device)
    scaling = None
    if cfg.rope_scaling is not None:  # hashable: lists as tuples
        scaling = tuple(
            tuple(value) if isinstance(value, list) else value
            for value in dataclasses.astuple(cfg.rope_scaling)
        )
    return _rope_tables(cfg.head_dim, cfg.rope_theta, scaling, seq_len, dtype, device)


@functools.lru_cache(maxsize=16)
def _rope_tables(
    head_dim: int,
    theta: float,
    scaling: Optional[tuple],
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    scaling = None if scaling is None else RopeScaling(*scaling)
    inv_freq = rope_frequencies(head_dim, theta, scaling, device, seq_len)
    return rope_cos_sin(
        inv_freq, seq_len, dtype, 1.0 if scaling is None else scaling.attention_factor
    )


def rope_frequencies(
    head_dim: int,
    theta: float,
    scaling: Optional[RopeScaling],
    device: Optional[torch.device] = None,
    seq_len: Optional[int] = None,
) -> torch.Tensor:
    """The rotation speed of each pair of dimensions (head_dim / 2 values), scaled as `scaling`
    says, by the operations of `transformers.modeling_rope_utils` in their order (so that the values
    are the same to the bit). LongRoPE's depend on the sequence's length (`seq_len`)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    if scaling is not None and scaling.type == "longrope":
        # Each pair slowed by its own factor: the short ones within the pretraining context.
        long = seq_len is not None and seq_len > scaling.original_max_seq_len
        factors = scaling.long_factor if long else scaling.short_factor
        return 1.0 / (torch.tensor(factors, dtype=torch.float32, device=device) * theta**exponents)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type == "yarn":
        return _yarn_frequencies(head_dim, theta, scaling, theta**exponents)
    # Llama 3.1: wavelengths longer than the pretraining context / low_freq_factor are slowed down
    # by `factor`, those shorter than context / high_freq_factor are kept, the band between is
    # interpolated.
    wavelength = 2 * math.pi / inv_freq
    context = scaling.original_max_seq_len
    scaled = torch.where(
        wavelength > context / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq
    )
    ramp = (context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    between = (1 - ramp) * scaled / scaling.factor + ramp * scaled
    in_band = ~(wavelength < context / scaling.high_freq_factor) * ~(
        wavelength > context / scaling.low_freq_factor
    )
    return torch.where(in_band, between, scaled)


def _yarn_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling, periods: torch.Tensor
) -> torch.Tensor:
    """YaRN (Peng et al. 2023): the pairs that turn more than beta_fast times within the pretraining
    context keep their frequency, those that turn fewer than beta_slow times are slowed by
    `factor`, and a linear ramp over the pairs between mixes the two. `periods`: the unscaled
    frequencies' inverses, theta ** (2i / head_dim)."""

    def pair_turning(turns: float) -> float:
        """The (fractional) pair that turns `turns` times over the pretraining context."""
        context = scaling.original_max_seq_len
        return (head_dim * math.log(context / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = pair_turning(scaling.beta_fast), pair_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    pairs = torch.arange(head_dim // 2, dtype=torch.float32)
    kept = (1 - torch.clamp((pairs - low) / (high - low), 0, 1)).to(periods.device)
    return (1.0 / (scaling.factor * periods)) * (1 - kept) + (1.0 / periods) * kept


def rope_cos_sin(
    inv_freq: torch.Tensor, seq_len: int, dtype: torch.dtype, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, (seq, head_dim): positions 0..seq_len-1 of the
    sequence, scaled by `attention_factor` (YaRN's and LongRoPE's; 1 otherwise)."""
    positions = torch.arange(seq_len, device=inv_freq.device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    if attention_factor == 1.0:
        return angles.cos().to(dtype), angles.sin().to(dtype)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)
