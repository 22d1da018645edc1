"""The transformer on its own: presets, config checks, ALiBi slopes, packed documents, FLOPs,
stacked projections."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from pipeline.config import CONF_DIR
from pipeline.errors import ConfigError
from pipeline.model.model_config import (
    ModelConfig,
    RopeScaling,
    flops_per_token,
    parameter_count,
    validate_model,
)
from pipeline.model.transformer import (
    Transformer,
    alibi_slopes,
    rope_cos_sin,
    rope_frequencies,
    shared_alibi_slopes,
    shared_rope_tables,
    stacked_linears,
)

PRESETS = (
    "tiny",
    "bloom-560m",
    "bloom-1b7",
    "bloom-7b1",
    "mistral-7b",
    "llama-3.2-1b",
    "llama-3.1-8b",
    "llama-2-13b",
    "poro-34b",
    "llama-3.1-70b",
    "megatron-146b",
    "bloom-176b",
    "qwen2.5-7b",
    "qwen3-8b",
    "gemma-3-12b",
    "olmo-2-7b",
    "phi-3-mini",
)
# Parameter counts of the published checkpoints (sum of numel over transformers'
# model.parameters()).
PUBLISHED_PARAMETERS = {
    "bloom-560m": 559_214_592,
    "bloom-1b7": 1_722_408_960,
    "bloom-7b1": 7_069_016_064,
    "mistral-7b": 7_241_732_096,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-2-13b": 13_015_864_320,
    "llama-3.1-70b": 70_553_706_496,
    "bloom-176b": 176_247_271_424,
}
# Shapes whose source gives only a rounded count, in billions: Poro-34B's, Qwen2.5-7B's, Qwen3-8B's,
# OLMo-2-7B's and Phi-3-mini's model cards, Megatron-LM's Table 1. (Gemma 3 12B's card counts its
# vision tower too: test_model_hf_architectures.py checks the text model against transformers.)
ROUNDED_PARAMETERS = {
    "poro-34b": 34.2,
    "megatron-146b": 145.6,
    "qwen2.5-7b": 7.6,
    "qwen3-8b": 8.2,
    "olmo-2-7b": 7.3,
    "phi-3-mini": 3.8,
}
COUNTED_BY_TRANSFORMERS = ("gemma-3-12b",)
SMALL_ALIBI = ModelConfig(
    hidden_size=48,
    num_layers=2,
    num_heads=12,
    num_kv_heads=12,
    ffn_size=192,
    vocab_size=300,
    position="alibi",
    norm="layernorm",
    activation="gelu",
    embedding_norm=True,
    bias=True,
)
SMALL_ROPE = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=96, vocab_size=300
)


def preset(name: str) -> ModelConfig:
    loaded = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), loaded)
    return OmegaConf.to_object(merged)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_validate_and_have_the_published_size(name):
    cfg = preset(name)
    validate_model(cfg)
    if name == "tiny":  # the only one instantiated: its parameters are what the formula says
        model = Transformer(cfg)
        assert sum(p.numel() for p in model.parameters()) == parameter_count(cfg)
        assert model.head.weight is model.embedding.tokens.weight
    elif name in COUNTED_BY_TRANSFORMERS:
        assert round(parameter_count(cfg) / 1e9, 2) == 11.77
    elif name in ROUNDED_PARAMETERS:
        assert round(parameter_count(cfg) / 1e9, 1) == ROUNDED_PARAMETERS[name]
    else:
        assert parameter_count(cfg) == PUBLISHED_PARAMETERS[name]


@pytest.mark.parametrize("num_heads", [8, 12, 16, 20, 32])
def test_alibi_slopes_match_bloom(num_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM's bias at key position 1 is exactly the slope.
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]
    torch.testing.assert_close(alibi_slopes(num_heads), bloom, rtol=1e-6, atol=0)


@pytest.mark.parametrize("cfg", [SMALL_ROPE, SMALL_ALIBI], ids=["rope", "alibi"])
def test_packed_documents_do_not_see_each_other(cfg):
    """With segment_ids, the second document of a packed row gets the logits it gets alone (both
    RoPE and ALiBi depend only on the distance between tokens, so absolute positions do not matter)."""
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(cfg, init_std=0.2)).eval()
    first, second = (
        torch.randint(0, cfg.vocab_size, (1, 7)),
        torch.randint(0, cfg.vocab_size, (1, 9)),
    )
    packed = torch.cat([first, second], dim=1)
    segments = torch.tensor([[0] * 7 + [1] * 9])
    with torch.no_grad():
        alone = model(second)
        together = model(packed, segment_ids=segments)[:, 7:]
        leaking = model(packed)[:, 7:]
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    assert (leaking - alone).abs().max() > 1e-3


def test_tiny_trains_one_step():
    torch.manual_seed(0)
    cfg = preset("tiny")
    model = Transformer(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    logits = model(ids)
    assert logits.shape == (2, 32, cfg.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert (
        abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 0.5
    )  # near uniform at init
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_padding_rows_are_not_predicted():
    cfg = SMALL_ROPE  # 300 tokens, padded to 384 rows
    model = Transformer(cfg)
    assert model.embedding.tokens.weight.shape[0] == cfg.padded_vocab_size == 384
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape[-1] == 300


def test_a_sliding_window_hides_the_tokens_before_it():
    """One layer, a window of 8: the last token's logits are those of its last 8 tokens alone (RoPE
    scores depend on distances only), and differ from the unwindowed model's."""
    cfg = dataclasses.replace(SMALL_ROPE, num_layers=1, sliding_window=8)
    torch.manual_seed(0)
    model = Transformer(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        windowed = model(ids)[0, -1]
        torch.testing.assert_close(windowed, model(ids[:, -8:])[0, -1], rtol=0, atol=1e-5)
        model.blocks[0].attn.window = None
        assert (model(ids)[0, -1] - windowed).abs().max() > 1e-3


@pytest.mark.parametrize(
    "change, key, allowed",
    [
        ({"position": "alibii"}, "model.position", "alibi, rope"),
        ({"norm": "batchnorm"}, "model.norm", "layernorm, rmsnorm"),
        ({"activation": "relu"}, "model.activation", "gelu, swiglu"),
        ({"num_heads": 5}, "model.num_heads", "a divisor of model.hidden_size=64"),
        ({"num_kv_heads": 3}, "model.num_kv_heads", "a divisor of model.num_heads=4"),
        ({"num_layers": 0}, "model.num_layers", "an integer >= 1"),
        (
            {"position": "alibi", "rope_scaling": RopeScaling()},
            "model.rope_scaling",
            "null when model.position=alibi",
        ),
        ({"qk_norm": "layer"}, "model.qk_norm", "none, head, full"),
        ({"norm_placement": "sandwich"}, "model.norm_placement", "pre, post"),
        ({"head_size": 15}, "model.head_size", "an even head size"),
        ({"num_heads": 5, "num_kv_heads": 5, "head_size": 16}, None, None),
        ({"sliding_window_layers": [1]}, "model.sliding_window_layers", "sliding_window set"),
        (
            {"sliding_window": 8, "sliding_window_layers": [2]},
            "model.sliding_window_layers",
            "each in 0..1",
        ),
        (
            {"rope_scaling": RopeScaling(type="longrope", short_factor=[1.0])},
            "model.rope_scaling.short_factor",
            "8 positive numbers",
        ),
        (
            {"hf_architecture": "Qwen2ForCausalLM"},
            "model.hf_architecture",
            "model.qkv_bias=False (needs True)",
        ),
        ({"hf_architecture": "GPT2LMHeadModel"}, "model.hf_architecture", "Phi3ForCausalLM"),
    ],
    ids=[
        "position",
        "norm",
        "activation",
        "heads",
        "kv-heads",
        "layers",
        "scaling-without-rope",
        "qk-norm",
        "norm-placement",
        "odd-head-size",
        "head-size-frees-the-heads",
        "window-layers-without-window",
        "window-layers-out-of-range",
        "longrope-factors",
        "architecture-misfit",
        "architecture-unknown",
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(change, key, allowed):
    if key is None:  # a valid change
        validate_model(dataclasses.replace(SMALL_ROPE, **change))
        return
    with pytest.raises(ConfigError) as error:
        validate_model(dataclasses.replace(SMALL_ROPE, **change))
    assert error.value.key == key
    assert allowed in str(error.value)


@pytest.mark.parametrize(
    "cfg", [SMALL_ROPE, dataclasses.replace(SMALL_ALIBI, vocab_size=384)], ids=["rope", "alibi"]
)
def test_flops_per_token_match_a_count_of_the_executed_matmuls(cfg):
    """PyTorch's FLOP counter over a real forward and backward pass: the reference attention
    computes the full seq x seq score matrix, as the formula counts it (no causal halving)."""
    cfg = dataclasses.replace(
        cfg, vocab_size=cfg.padded_vocab_size
    )  # the counter sees the padded head
    model = Transformer(cfg)
    batch, seq = 2, 24
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, cfg.vocab_size, (batch, seq))).sum().backward()
    assert flops_per_token(cfg, seq) * batch * seq == counter.get_total_flops()


def test_cli_prints_a_preset_and_rejects_a_bad_value(tmp_path):
    from tests.conftest import run_cli

    out = run_cli(
        "--cfg", "job", "stage=clean", "lang=nob", "model=bloom-560m", cwd=tmp_path
    ).stdout
    assert (
        "position: alibi" in out and "vocab_size: 250880" in out and "embedding_norm: true" in out
    )
    result = run_cli("stage=clean", "lang=nob", "model.position=alibii", cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert "Invalid value for `model.position`: 'alibii'. Allowed: alibi, rope." in result.stderr
    assert not (tmp_path / "work" / "nob" / "clean").exists()


def test_layers_share_one_rope_table_and_slope_tensor_per_shape_and_device():
    cfg = ModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        ffn_size=128,
        vocab_size=128,
        max_seq_len=64,
        position="rope",
        rope_theta=50000.0,
    )
    cpu = torch.device("cpu")
    cos, sin = shared_rope_tables(cfg, 32, torch.float32, cpu)
    assert shared_rope_tables(cfg, 32, torch.float32, cpu)[0] is cos  # made once, then shared
    fresh_cos, fresh_sin = rope_cos_sin(
        rope_frequencies(cfg.head_dim, cfg.rope_theta, None, cpu), 32, torch.float32
    )
    assert torch.equal(cos, fresh_cos) and torch.equal(sin, fresh_sin)
    # Another length or another scaling is another table.
    assert shared_rope_tables(cfg, 16, torch.float32, cpu)[0].shape[0] == 16
    scaled = dataclasses.replace(cfg, rope_scaling=RopeScaling(factor=8.0, original_max_seq_len=16))
    assert not torch.equal(shared_rope_tables(scaled, 32, torch.float32, cpu)[0], cos)
    assert shared_alibi_slopes(12, cpu) is shared_alibi_slopes(12, cpu)
    assert torch.equal(shared_alibi_slopes(12, cpu), alibi_slopes(12))


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_linears_match_the_layers_one_by_one(bias):
    """q, k, v (gate, up) from one product over their stacked weights: the same outputs and
    gradients as the layers run apart, also when some of the weights are frozen."""
    torch.manual_seed(0)
    layers = tuple(torch.nn.Linear(16, width, bias=bias).double() for width in (8, 4, 4))
    x = torch.randn(2, 5, 16, dtype=torch.double, requires_grad=True)
    for frozen in (None, layers[1].weight):
        if frozen is not None:
            frozen.requires_grad_(False)
        stacked = stacked_linears(x, layers).split([8, 4, 4], dim=-1)
        apart = [layer(x) for layer in layers]
        for mine, theirs in zip(stacked, apart, strict=True):
            torch.testing.assert_close(mine, theirs)
        trained = [x] + [p for layer in layers for p in layer.parameters() if p.requires_grad]
        grads = [torch.randn_like(out) for out in apart]
        for mine, theirs in zip(
            torch.autograd.grad(stacked, trained, grads),
            torch.autograd.grad(apart, trained, grads),
            strict=True,
        ):
            torch.testing.assert_close(mine, theirs)
