"""bench/gguf_to_hf.py on a tiny Llama GGUF that the test writes as llama.cpp's converter would: the
folder holds the weights the GGUF was made from, transformers loads it, and the pipeline's import
gives transformers' logits."""

from __future__ import annotations

import importlib.util
import json

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.model.base_shape import base_shape
from pipeline.model.hf_import import from_hf
from pipeline.tokenization.folder import load_tokenizer, token_roles
from tests.conftest import REPO, TRICKY_TEXTS

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
ROPE_THETA = 50000.0
END_OF_TEXT = "<|endoftext|>"
TEXTS = [
    "Dette er en liten tekst om Norge og norsk språk.",
    "The capital of France is Paris.",
    "Blåbærsyltetøy på brødskiva, takk!",
]


def _converter():
    spec = importlib.util.spec_from_file_location("gguf_to_hf", REPO / "bench" / "gguf_to_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpt2_like_tokenizer() -> Tokenizer:
    """Byte-level BPE with one special token, <|endoftext|> at id 0, as GPT-2's and SmolLM2's."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        TEXTS * 10,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=[END_OF_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tokenizer


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter reorders the rows of q and k for its rotary embedding (transformers
    undoes it)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(path, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """A llama GGUF: F32 tensors, V in F16, ffn_down in Q8_0, a tied head; returns the Hugging Face
    tensors (in float32, as the dequantized file holds them) that it was made from."""
    content = json.loads(tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(content["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in content["merges"]]
    vocab, head_dim = len(tokens), HIDDEN // HEADS
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t == END_OF_TEXT else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(END_OF_TEXT))
    writer.add_eos_token_id(tokens.index(END_OF_TEXT))
    hf = {
        "model.embed_tokens.weight": weight(vocab, HIDDEN),
        "model.norm.weight": 1 + weight(HIDDEN),
    }
    writer.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    for layer in range(LAYERS):
        prefix, block = f"model.layers.{layer}.", f"blk.{layer}."
        q, k = weight(HIDDEN, HIDDEN), weight(KV_HEADS * head_dim, HIDDEN)
        v = weight(KV_HEADS * head_dim, HIDDEN).astype(np.float16)
        down = gguf.quants.quantize(weight(HIDDEN, FFN), gguf.GGMLQuantizationType.Q8_0)
        hf |= {
            prefix + "self_attn.q_proj.weight": q,
            prefix + "self_attn.k_proj.weight": k,
            prefix + "self_attn.v_proj.weight": v.astype(np.float32),
            prefix + "self_attn.o_proj.weight": weight(HIDDEN, HIDDEN),
            prefix + "mlp.gate_proj.weight": weight(FFN, HIDDEN),
            prefix + "mlp.up_proj.weight": weight(FFN, HIDDEN),
            prefix + "mlp.down_proj.weight": gguf.quants.dequantize(
                down, gguf.GGMLQuantizationType.Q8_0
            ),
            prefix + "input_layernorm.weight": 1 + weight(HIDDEN),
            prefix + "post_attention_layernorm.weight": 1 + weight(HIDDEN),
        }
        writer.add_tensor(block + "attn_norm.weight", hf[prefix + "input_layernorm.weight"])
        writer.add_tensor(block + "attn_q.weight", llama_cpp_permute(q, HEADS))
        writer.add_tensor(block + "attn_k.weight", llama_cpp_permute(k, KV_HEADS))
        writer.add_tensor(block + "attn_v.weight", v)
        writer.add_tensor(block + "attn_output.weight", hf[prefix + "self_attn.o_proj.weight"])
        writer.add_tensor(block + "ffn_norm.weight", hf[prefix + "post_attention_layernorm.weight"])
        writer.add_tensor(block + "ffn_gate.weight", hf[prefix + "mlp.gate_proj.weight"])
        writer.add_tensor(block + "ffn_up.weight", hf[prefix + "mlp.up_proj.weight"])
        writer.add_tensor(
            block + "ffn_down.weight",
            down,
            raw_shape=down.shape,
            raw_dtype=gguf.GGMLQuantizationType.Q8_0,
        )
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny GGUF, the tensors it was made from, its tokenizer, and its conversion in float32 and
    bfloat16."""
    folder = tmp_path_factory.mktemp("gguf")
    tokenizer = gpt2_like_tokenizer()
    expected = write_tiny_gguf(folder / "tiny.gguf", tokenizer)
    converter = _converter()
    converter.main([str(folder / "tiny.gguf"), str(folder / "f32"), "--dtype", "float32"])
    converter.main([str(folder / "tiny.gguf"), str(folder / "bf16")])
    return folder, expected, tokenizer, converter


def stored(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as file:
        return {name: file.get_tensor(name) for name in file.keys()}


def test_the_folder_holds_the_tensors_the_gguf_was_made_from_in_the_dtype_asked(converted):
    folder, expected, _, _ = converted
    f32, bf16 = stored(folder / "f32"), stored(folder / "bf16")
    assert set(f32) == set(bf16) == set(expected)  # tied: no lm_head.weight
    for name, tensor in expected.items():
        assert f32[name].dtype == torch.float32 and bf16[name].dtype == torch.bfloat16
        assert torch.equal(f32[name], torch.from_numpy(tensor)), name
        assert torch.equal(bf16[name], torch.from_numpy(tensor).to(torch.bfloat16)), name
    config = json.loads((folder / "f32" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    shape = base_shape(str(folder / "f32"))
    assert (
        shape["hidden_size"],
        shape["num_layers"],
        shape["num_heads"],
        shape["num_kv_heads"],
        shape["ffn_size"],
        shape["vocab_size"],
        shape["rope_theta"],
        shape["tie_embeddings"],
    ) == (
        HIDDEN,
        LAYERS,
        HEADS,
        KV_HEADS,
        FFN,
        len(expected["model.embed_tokens.weight"]),
        ROPE_THETA,
        True,
    )


def test_transformers_and_the_pipeline_give_the_gguf_models_logits(converted):
    from transformers import AutoModelForCausalLM

    folder, _, tokenizer, converter = converted
    ids = torch.tensor([tokenizer.encode(TEXTS[1]).ids])
    with torch.no_grad():
        from_gguf = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file="tiny.gguf",
            dtype=torch.float32,
            **converter._dequantized(folder / "tiny.gguf"),
        )(ids).logits
        reference = AutoModelForCausalLM.from_pretrained(folder / "f32").eval()(ids).logits
        model, cfg = from_hf(folder / "f32")
        ours = model.eval()(ids)[..., : cfg.vocab_size]
    assert torch.allclose(reference, from_gguf, atol=1e-5)
    assert torch.allclose(ours, reference, atol=1e-4), (ours - reference).abs().max()


def test_the_tokenizer_encodes_as_the_original_and_names_its_one_special_token(converted):
    from transformers import AutoTokenizer

    folder, _, tokenizer, _ = converted
    auto = AutoTokenizer.from_pretrained(folder / "f32")
    ours = load_tokenizer(folder / "f32")
    for text in TEXTS + TRICKY_TEXTS:
        ids = tokenizer.encode(text).ids
        assert (
            auto.encode(text, add_special_tokens=False)
            == ours.encode(text, add_special_tokens=False).ids
            == ids
        )
    assert ours.encode(f"slutt{END_OF_TEXT}start").ids.count(0) == 1  # special: never split
    special = json.loads((folder / "f32" / "special_tokens_map.json").read_text())
    assert special == {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT}
    config = json.loads((folder / "f32" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "gguf_file" not in config
    assert token_roles(folder / "f32", ours) == {"bos": 0, "eos": 0, "pad": 0, "unk": None}


def test_a_folder_that_is_not_empty_is_refused(converted):
    folder, _, _, converter = converted
    with pytest.raises(SystemExit, match="is not empty"):
        converter.main([str(folder / "tiny.gguf"), str(folder / "f32")])
    assert not (folder / "f32.partial").exists()


def test_eos_token_names_the_document_end_and_an_unknown_one_is_refused(converted):
    folder, _, tokenizer, converter = converted
    word = tokenizer.id_to_token(
        tokenizer.get_vocab_size() - 1
    )  # the last merge: not the file's end of sequence
    converter.main([str(folder / "tiny.gguf"), str(folder / "eos"), "--eos-token", word])
    special = json.loads((folder / "eos" / "special_tokens_map.json").read_text())
    assert special == {"bos_token": END_OF_TEXT, "eos_token": word}
    assert (
        token_roles(folder / "eos", load_tokenizer(folder / "eos"))["eos"]
        == tokenizer.token_to_id(word)
        != 0
    )
    with pytest.raises(
        SystemExit, match="'<\\|im_end\\|>' is not a token of this model's vocabulary"
    ):
        converter.main(
            [str(folder / "tiny.gguf"), str(folder / "chat"), "--eos-token", "<|im_end|>"]
        )
    assert not (folder / "chat").exists()
