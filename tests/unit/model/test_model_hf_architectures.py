"""Qwen2 (Qwen2.5), Qwen3, OLMo 2, Phi-3, Gemma 2 and Gemma 3 (issue 54) on tiny random checkpoints built with
`transformers`, as test_model_hf.py does for BLOOM, Llama and Mistral: our logits equal transformers'
(float32, max abs difference < 1e-4) both ways, every tensor round trips bit-identically in the
architecture's own layout, RoPE scalings are transformers' to the bit, and what the model cannot
compute exactly fails when the base is read, naming the key."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from pipeline.model.base_shape import base_config
from pipeline.model.hf_config import (
    CheckpointError,
    architecture_for,
    config_from_hf,
    config_to_hf,
)
from pipeline.model.hf_export import to_hf
from pipeline.model.hf_import import from_hf
from pipeline.model.model_config import ModelConfig, parameter_count, training_seq_len
from pipeline.model.transformer import Transformer, rope_cos_sin, rope_frequencies

from tests.unit.model.test_model_hf import hf_logits, stored_tensors

VOCAB = 1000  # padded to 1024 rows inside the model
# Larger than transformers' 0.02, so that every part moves the logits.
INIT = 0.1
SEQ = 48
TOLERANCE = 1e-4  # float32 round-off of two orders of the same operations
COMMON = {
    "vocab_size": VOCAB,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "initializer_range": INIT,
    "attn_implementation": "eager",
}
# Phi-3's and OLMo 2's default special ids lie outside a 1000-token vocabulary.
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def qwen2():
    # Grouped-query attention, tied embeddings, YaRN from a 16-token pretraining context, so that
    # the tests' 48 positions reach the slowed frequencies.
    return transformers.Qwen2Config(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        rope_theta=1e6,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        **COMMON,
    )


WINDOW = 16  # shorter than the tests' sequences, so that the windows change the logits


def qwen2_window():
    # The second layer attends within a window (use_sliding_window, max_window_layers=1).
    return transformers.Qwen2Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
        **COMMON,
    )


def qwen3():
    # head_dim 32 with hidden 64 over 4 heads (Qwen3 sets its own head size), linear RoPE scaling.
    return transformers.Qwen3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        **COMMON,
    )


def olmo2():
    return transformers.Olmo2Config(
        hidden_size=64, num_attention_heads=8, num_key_value_heads=2, **SPECIAL_IDS, **COMMON
    )


def phi3():
    return transformers.Phi3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **SPECIAL_IDS, **COMMON
    )


def phi3_longrope():
    # LongRoPE from a 32-token pretraining context: the short factors up to 32 tokens, the long
    # ones beyond (the tests run 24 and 48).
    return transformers.Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        original_max_position_embeddings=32,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [1.0 + 0.5 * i for i in range(8)],
        },
        **SPECIAL_IDS,
        **COMMON,
    )


def gemma2():
    # Every other layer windowed (the first), a query scale other than head_dim, and soft caps low
    # enough to bite on these logits.
    return transformers.Gemma2Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        **SPECIAL_IDS,
        **COMMON,
    )


def gemma3():
    # q/k norms, multi-query attention, a windowed local layer with its own RoPE base and a global
    # one with linear scaling.
    return transformers.Gemma3TextConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_theta=1e6,
        rope_local_base_freq=1e3,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        **SPECIAL_IDS,
        **COMMON,
    )


BUILDERS = {
    "qwen2-yarn": qwen2,
    "qwen2-sliding-window": qwen2_window,
    "qwen3-head-dim-linear": qwen3,
    "olmo2": olmo2,
    "phi3": phi3,
    "phi3-longrope": phi3_longrope,
    "gemma2": gemma2,
    "gemma3": gemma3,
}


def random_model(config):
    """A random model of `config` whose biases and norm weights are random too (transformers starts
    them at 0 and 1, which would hide a misplaced bias or q/k norm)."""
    torch.manual_seed(0)
    return randomised_vectors(transformers.AutoModelForCausalLM.from_config(config).eval())


def randomised_vectors(model):
    """`model` with its biases and norm weights drawn around 0 and 1."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                start = 1.0 if "norm" in name else 0.0
                parameter.copy_(start + 0.2 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each tiny random model, saved by transformers; the name -> (folder, transformers model)."""
    saved = {}
    for name, build in BUILDERS.items():
        model = random_model(build())
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        saved[name] = (folder, model)
    return saved


@pytest.fixture(scope="module")
def token_ids():
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", BUILDERS)
def test_from_hf_matches_transformers_logits(checkpoints, token_ids, name):
    folder, reference = checkpoints[name]
    model, cfg = from_hf(folder)
    assert cfg.hf_architecture == reference.config.architectures[0]
    # 48 tokens reach YaRN's and Phi-3's long factors' positions; 24 keep Phi-3 to its short ones.
    for length in (SEQ, 24):
        ids = token_ids[:, :length]
        with torch.no_grad():
            ours = model(ids)
        expected = hf_logits(reference, ids)
        assert expected.std() > 0.1  # logits that differ from token to token
        torch.testing.assert_close(ours, expected, rtol=0, atol=TOLERANCE)
    # What the memory planner and MFU count is what the checkpoint holds.
    assert parameter_count(cfg) == reference.num_parameters()


@pytest.mark.parametrize("name", BUILDERS)
def test_to_hf_writes_the_architectures_own_layout_with_the_same_logits(
    checkpoints, token_ids, tmp_path, name
):
    folder, reference = checkpoints[name]
    model, _ = from_hf(folder)
    to_hf(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == reference.config.architectures

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(reference)
    for length in (SEQ, 24):
        ids = token_ids[:, :length]
        torch.testing.assert_close(
            hf_logits(reloaded, ids), hf_logits(reference, ids), rtol=0, atol=TOLERANCE
        )
    # The same tensor names (Phi-3's fused qkv_proj and gate_up_proj too), bit for bit.
    original, exported = stored_tensors(folder), stored_tensors(tmp_path / "out")
    assert original.keys() == exported.keys()
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
    again, _ = from_hf(tmp_path / "out")
    for key, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


@pytest.mark.parametrize(
    "name, layer_types",
    [
        ("qwen2-sliding-window", ["full_attention", "sliding_attention"]),
        ("gemma2", ["sliding_attention", "full_attention"]),
        ("gemma3", ["sliding_attention", "full_attention"]),
    ],
)
def test_the_windowed_layers_travel_and_apply_at_any_length(
    checkpoints, token_ids, tmp_path, name, layer_types
):
    folder, reference = checkpoints[name]
    model, cfg = from_hf(folder)
    assert cfg.sliding_window == WINDOW
    assert [cfg.layer_window(layer) for layer in range(2)] == [
        WINDOW if kind == "sliding_attention" else None for kind in layer_types
    ]
    # the window does not shorten the training length
    assert training_seq_len(cfg, None) == min(cfg.max_seq_len, 2048) > WINDOW
    to_hf(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["sliding_window"] == WINDOW and config["layer_types"] == layer_types
    # Three windows' worth of tokens: the windowed layer sees only the last 16 of them.
    longer = torch.cat([token_ids, token_ids[:, :8]], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(
            model(longer), hf_logits(reference, longer), rtol=0, atol=TOLERANCE
        )


def hf_config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def with_config(source, target, **changes):
    """A folder holding `source`'s config.json with `changes` (enough to be read: the shape is read
    before any weight)."""
    target.mkdir()
    (target / "config.json").write_text(json.dumps({**hf_config_of(source), **changes}))
    return target


@pytest.mark.parametrize(
    "name, changes, message",
    [
        (
            "qwen2-yarn",
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "rope_parameters": None},
            r"`rope_scaling.rope_type`='dynamic' is not supported \(transformers' dynamic NTK",
        ),
        (
            "phi3",
            {"partial_rotary_factor": 0.75},
            r"`partial_rotary_factor`=0.75 is not supported \(RoPE rotates the whole head\)",
        ),
        (
            "qwen3-head-dim-linear",
            {"attention_bias": True},
            r"`attention_bias`=True is not supported \(Qwen3ForCausalLM's attention_bias adds a "
            r"bias to o_proj too",
        ),
        (
            "phi3-longrope",
            {
                "rope_parameters": None,
                "rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [1.0]},
            },
            r"`rope_scaling.short_factor`=\[1.0\] is not supported \(LongRoPE needs one factor "
            r"per pair of a head's 16 values\)",
        ),
        (
            "qwen2-sliding-window",
            {"layer_types": ["full_attention", "chunked_attention"]},
            r"`layer_types`=.* is not supported \(one of full_attention and sliding_attention",
        ),
        (
            "gemma2",
            {"hidden_activation": "gelu"},
            r"`hidden_activation`='gelu' is not supported \(GeGLU with GELU's tanh approximation\)",
        ),
        (
            "gemma3",
            {"use_bidirectional_attention": True},
            r"`use_bidirectional_attention`=True is not supported \(the model is causal\)",
        ),
    ],
    ids=[
        "dynamic-rope",
        "partial-rotary",
        "qwen3-attention-bias",
        "longrope-factors",
        "layers",
        "gemma-activation",
        "gemma-bidirectional",
    ],
)
def test_what_the_model_cannot_compute_exactly_fails_when_the_base_is_read(
    checkpoints, tmp_path, name, changes, message
):
    folder = with_config(checkpoints[name][0], tmp_path / "changed", **changes)
    # base_config is what the command line reads at start (model.base's shape).
    with pytest.raises(CheckpointError, match=message):
        base_config(str(folder))


def rope_config(kind: str, **parameters):
    """A Llama config whose RoPE is `kind` (head_dim 64, theta 500000, context 4096)."""
    return transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        num_hidden_layers=1,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rope_scaling={"rope_type": kind, **parameters},
    )


@pytest.mark.parametrize(
    "config, seq_len",
    [
        (
            rope_config(
                "llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=512,
            ),
            64,
        ),
        (rope_config("linear", factor=4.0), 64),
        (rope_config("yarn", factor=4.0, original_max_position_embeddings=1024), 64),
        (
            rope_config(
                "yarn",
                factor=8.0,
                original_max_position_embeddings=512,
                beta_fast=16,
                beta_slow=2,
                truncate=False,
                mscale=0.707,
                mscale_all_dim=1.0,
            ),
            64,
        ),
        (
            transformers.Phi3Config(
                hidden_size=256,
                num_attention_heads=4,
                max_position_embeddings=4096,
                original_max_position_embeddings=256,
                rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0 + 0.05 * i for i in range(32)],
                    "long_factor": [1.0 + 0.7 * i for i in range(32)],
                },
            ),
            300,
        ),
    ],
    ids=["llama3", "linear", "yarn", "yarn-mscale-untruncated", "longrope"],
)
def test_rope_scaling_is_transformers_to_the_bit(config, seq_len):
    """Frequencies and cos/sin tables from the config as the base's import reads it, against the
    rotary embedding of transformers' own model (for LongRoPE on both sides of the pretraining
    context)."""
    hf = config.to_dict()
    cfg = config_from_hf(
        hf, {"llama": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM"}[hf["model_type"]], "test"
    )
    rotary_class = (
        transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding
        if hf["model_type"] == "phi3"
        else transformers.models.llama.modeling_llama.LlamaRotaryEmbedding
    )
    rotary = rotary_class(config)
    for length in sorted({seq_len, 32}):
        positions = torch.arange(length)[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
        inv_freq = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, None, length)
        assert torch.equal(inv_freq, rotary.inv_freq), length
        ours = rope_cos_sin(inv_freq, length, torch.float32, cfg.rope_scaling.attention_factor)
        assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0]), length


@pytest.mark.parametrize(
    "shape, architecture",
    [
        ({"qkv_bias": True, "tie_embeddings": True}, "Qwen2ForCausalLM"),
        ({"qk_norm": "head", "head_size": 32}, "Qwen3ForCausalLM"),
        ({"qk_norm": "full", "norm_placement": "post"}, "Olmo2ForCausalLM"),
        ({"hf_architecture": "Phi3ForCausalLM"}, "Phi3ForCausalLM"),
        (
            {
                "activation": "geglu",
                "norm_placement": "both",
                "norm_unit_offset": True,
                "embedding_scale": True,
                "attention_softcap": 2.0,
                "logit_softcap": 3.0,
                "tie_embeddings": True,
            },
            "Gemma2ForCausalLM",
        ),
        (
            {
                "activation": "geglu",
                "norm_placement": "both",
                "norm_unit_offset": True,
                "embedding_scale": True,
                "qk_norm": "head",
                "sliding_window": 8,
                "sliding_window_layers": [0],
                "rope_local_theta": 100.0,
            },
            "Gemma3ForCausalLM",
        ),
    ],
    ids=["qwen2", "qwen3", "olmo2", "phi3", "gemma2", "gemma3"],
)
def test_a_new_model_exports_as_the_architecture_its_shape_calls_for(
    tmp_path, token_ids, shape, architecture
):
    """A model trained here from scratch (no base) of each shape, random biases and norms."""
    sizes = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
    cfg = ModelConfig(
        **sizes, ffn_size=96, vocab_size=VOCAB, init_std=INIT, **{"tie_embeddings": False, **shape}
    )
    torch.manual_seed(0)
    model = randomised_vectors(Transformer(cfg).eval())
    to_hf(model, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    )
    assert type(reloaded).__name__ == architecture
    with torch.no_grad():
        torch.testing.assert_close(
            hf_logits(reloaded, token_ids), model(token_ids), rtol=0, atol=TOLERANCE
        )


@pytest.mark.parametrize(
    "name", ["qwen2.5-7b", "qwen3-8b", "gemma-3-12b", "olmo-2-7b", "phi-3-mini", "mistral-7b"]
)
def test_the_presets_count_what_transformers_builds_of_their_config(name):
    """The preset written as its architecture's config.json, built by transformers on the meta
    device (no memory): the same parameters as parameter_count, which the memory plan uses."""
    from tests.unit.model.test_model import preset

    cfg = preset(name)
    architecture = architecture_for(cfg)
    hf = config_to_hf(cfg, architecture, "bfloat16", {})
    config = transformers.AutoConfig.for_model(
        hf.pop("model_type"), **{k: v for k, v in hf.items() if k != "architectures"}
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == architecture
    assert model.num_parameters() == parameter_count(cfg)
