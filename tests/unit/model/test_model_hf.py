"""Hugging Face interop on tiny random checkpoints built with `transformers`: logits both ways,
bit-identical round trips, sharded folders, tokenizers, and errors that say which file is wrong."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_config import CheckpointError
from pipeline.model.hf_export import to_hf
from pipeline.model.hf_import import from_hf
from pipeline.model.transformer import Transformer

VOCAB = 1000  # not a multiple of 128: the project's model pads it to 1024 rows
# A larger initialisation than transformers' 0.02 so that every part (positions, scaling, norms)
# moves the logits.
INIT = 0.1
SEQ = 48


def bloom(heads: int):
    return BloomForCausalLM(
        BloomConfig(
            hidden_size=4 * heads,
            n_layer=2,
            n_head=heads,
            vocab_size=VOCAB,
            initializer_range=INIT,
            attn_implementation="eager",
        )
    )


def llama():
    # Grouped-query attention (8 query heads, 2 key/value heads), Llama 3.1's RoPE scaling with a
    # pretraining context short enough that the tests' positions reach its scaled band, tied
    # embeddings.
    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            rope_theta=500000.0,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rms_norm_eps=1e-5,
            initializer_range=INIT,
            attn_implementation="eager",
        )
    )


def mistral():
    return MistralForCausalLM(
        MistralConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            sliding_window=SEQ,
            tie_word_embeddings=False,
            initializer_range=INIT,
            attn_implementation="eager",
        )
    )


BUILDERS = {
    "bloom-12-heads": lambda: bloom(12),
    "bloom-20-heads": lambda: bloom(20),
    "llama-gqa": llama,
    "mistral": mistral,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each tiny random model, saved by transformers; the name -> (folder, transformers model)."""
    saved = {}
    for name, build in BUILDERS.items():
        torch.manual_seed(0)
        model = build().eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        saved[name] = (folder, model)
    return saved


@pytest.fixture(scope="module")
def token_ids():
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def stored_tensors(folder) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    return tensors


@pytest.mark.parametrize("name", BUILDERS)
def test_from_hf_matches_transformers_logits(checkpoints, token_ids, name):
    folder, reference = checkpoints[name]
    model, cfg = from_hf(folder)
    with torch.no_grad():
        ours = model(token_ids)
    expected = hf_logits(reference, token_ids)
    assert (
        expected.std() > 0.1
    )  # logits that differ from token to token: a wrong position would show
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-4)
    assert cfg.vocab_size == VOCAB and model.embedding.tokens.weight.shape[0] == 1024


@pytest.mark.parametrize("name", BUILDERS)
def test_to_hf_loads_in_transformers_with_the_same_logits_and_round_trips_bit_identically(
    checkpoints, token_ids, tmp_path, name
):
    folder, reference = checkpoints[name]
    model, _ = from_hf(folder)
    to_hf(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (
        config["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]
    )
    assert config["vocab_size"] == VOCAB  # the 24 padding rows are cut off

    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(reference)
    torch.testing.assert_close(
        hf_logits(reloaded, token_ids), hf_logits(reference, token_ids), rtol=0, atol=1e-4
    )

    original, exported = stored_tensors(folder), stored_tensors(tmp_path / "out")
    assert original.keys() == exported.keys()
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
    again, _ = from_hf(tmp_path / "out")
    for key, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor), key


def test_bfloat16_sharded_checkpoint_round_trips_in_its_dtype(tmp_path, token_ids):
    torch.manual_seed(0)
    llama().to(torch.bfloat16).save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    model, _ = from_hf(tmp_path / "hf")
    assert model.embedding.tokens.weight.dtype == torch.bfloat16
    to_hf(model, tmp_path / "out", max_shard_bytes=100_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    original, exported = stored_tensors(tmp_path / "hf"), stored_tensors(tmp_path / "out")
    assert original.keys() == exported.keys()
    assert all(
        exported[k].dtype == torch.bfloat16 and torch.equal(exported[k], t)
        for k, t in original.items()
    )
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.dtype == torch.bfloat16


def test_original_bloom_layout_without_the_transformer_prefix(checkpoints, token_ids, tmp_path):
    """bigscience's own files store the body as `h.0...`, `word_embeddings...` (BloomModel's names)."""
    from safetensors.torch import save_file

    folder, reference = checkpoints["bloom-12-heads"]
    tensors = {
        k.removeprefix("transformer."): v.contiguous() for k, v in stored_tensors(folder).items()
    }
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    model, _ = from_hf(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(
            model(token_ids), hf_logits(reference, token_ids), rtol=0, atol=1e-4
        )


def test_a_new_model_exports_for_transformers(tmp_path, token_ids):
    """A model trained here (random init) is unpadded and loads with the logits it has here."""
    cfg = ModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=4,
        ffn_size=96,
        vocab_size=VOCAB,
        tie_embeddings=False,
        init_std=INIT,
    )
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    to_hf(model, tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
    assert reloaded.lm_head.weight.shape == (VOCAB, 64)
    with torch.no_grad():
        torch.testing.assert_close(
            hf_logits(reloaded, token_ids), model(token_ids), rtol=0, atol=1e-4
        )


def project_tokenizer() -> Tokenizer:
    """A byte-level BPE with the project's special tokens at ids 0-3, as the tokenizer stage makes
    them."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<pad>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["Blåbærsyltetøy på brødskiva, takk!"] * 10, trainer)
    return tokenizer


@pytest.mark.parametrize("form", ["object", "folder"])
def test_tokenizer_files_and_special_token_ids_travel_with_the_model(checkpoints, tmp_path, form):
    tokenizer = project_tokenizer()
    if form == "folder":
        from pipeline.tokenization.tokenizer_config import SpecialTokens
        from pipeline.tokenization.folder import write_tokenizer_folder
        from pipeline.tokenization.folder import TrainedTokenizer

        (tmp_path / "tok").mkdir()
        write_tokenizer_folder(tmp_path / "tok", TrainedTokenizer(tokenizer), SpecialTokens())
        tokenizer = tmp_path / "tok"
    model, _ = from_hf(checkpoints["mistral"][0])
    to_hf(model, tmp_path / "out", tokenizer=tokenizer)
    expected = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert generation == expected and all(config[k] == v for k, v in expected.items())
    loaded = AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "Blåbærsyltetøy på brødskiva"
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<s>", "</s>", "<pad>")


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100)).save_pretrained(
        tmp_path
    )
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel") as error:
        from_hf(tmp_path)
    for supported in ("BloomForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"):
        assert supported in str(error.value)


def broken_copy(source, target, damage):
    shutil.copytree(source, target)
    damage(target)
    return target


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
        (
            lambda d: (d / "model.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()[:1000]
            ),
            "is not a readable safetensors file",
        ),
        (
            lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
            "only safetensors are read",
        ),
        (
            lambda d: (d / "config.json").write_text(
                (d / "config.json").read_text().replace('"n_layer": 2', '"n_layer": 3')
            ),
            "tensor `transformer.h.2.input_layernorm.weight` is missing",
        ),
        (
            lambda d: (d / "config.json").write_text(
                (d / "config.json")
                .read_text()
                .replace(f'"vocab_size": {VOCAB}', '"vocab_size": 900')
            ),
            "has shape (1000, 48), but config.json implies (900, 48)",
        ),
    ],
    ids=[
        "no-config",
        "bad-json",
        "truncated-weights",
        "pickle-only",
        "missing-tensor",
        "wrong-shape",
    ],
)
def test_missing_or_corrupt_files_fail_clearly(checkpoints, tmp_path, damage, message):
    folder = broken_copy(checkpoints["bloom-12-heads"][0], tmp_path / "broken", damage)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_hf(folder)


def test_missing_shard_is_named(tmp_path):
    llama().save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    shard = sorted((tmp_path / "hf").glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shards that are missing: .*{shard.name}"):
        from_hf(tmp_path / "hf")


def test_export_refuses_what_no_supported_architecture_expresses(tmp_path):
    cfg = ModelConfig(
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=4,
        ffn_size=64,
        vocab_size=128,
        position="alibi",
        norm="rmsnorm",
    )
    with pytest.raises(
        CheckpointError, match=r"BloomForCausalLM .*model.norm='rmsnorm' \(needs 'layernorm'\)"
    ):
        to_hf(Transformer(cfg), tmp_path / "out")
