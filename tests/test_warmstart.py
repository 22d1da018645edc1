"""The embedding transfer of the warm start, on small tokenizers trained here."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.model import ModelConfig, Transformer
from pipeline.tokenization.config import SpecialTokens, TokenizerConfig
from pipeline.tokenization.folder import write_tokenizer_folder
from pipeline.tokenization.surfaces import spelling, token_bytes
from pipeline.tokenization.training import TrainedTokenizer, train_tokenizer
from pipeline.warmstart.initialise import warm_started
from pipeline.warmstart.transfer import build_matrix, plan_rows

ENGLISH = ["the king had three daughters and a house by the sea"] * 50 + ["she walked home in the rain"] * 50
NORWEGIAN = ["kongen hadde tre døtre og et hus ved sjøen"] * 50 + ["hun gikk hjem i regnet, the end"] * 50
ROLES = {"bos": 0, "eos": 1, "pad": 2, "unk": 3}


def bpe(texts: list[str], vocab: int = 512) -> Tokenizer:
    return train_tokenizer(texts, TokenizerConfig(vocab_size=vocab)).tokenizer


def metaspace(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=120, special_tokens=SpecialTokens().in_id_order()))
    return tokenizer


def test_token_bytes_reads_both_spellings():
    assert token_bytes("Ġhus", "byte_level") == b" hus"
    assert token_bytes("Ã¸", "byte_level") == "ø".encode("utf-8")
    assert token_bytes("\u2581hus", "metaspace") == b" hus"
    assert token_bytes("<0xC3>", "metaspace") == b"\xc3"
    assert spelling(bpe(ENGLISH)) == "byte_level" and spelling(metaspace(ENGLISH)) == "metaspace"


def test_mean_rows_copy_shared_tokens_and_average_the_pieces_of_new_ones():
    old, new = bpe(ENGLISH), bpe(NORWEGIAN)
    sources = plan_rows(new, old, ROLES, ROLES)
    old_matrix = torch.randn(old.get_vocab_size(), 8)
    matrix, counts = build_matrix(old_matrix, new.get_vocab_size(), sources, "mean", torch.Generator().manual_seed(0))
    assert counts["special"] == 4 and counts["copied"] > 0 and counts["averaged"] > 0
    for token in ("Ġthe", "e"):
        new_id, old_id = new.token_to_id(token), old.token_to_id(token)
        assert sources.kinds[new_id] == "copied" and torch.equal(matrix[new_id], old_matrix[old_id])
    averaged = [i for i, kind in sources.kinds.items() if kind == "averaged" and len(sources.old_ids[i]) > 1]
    for new_id in averaged[:20]:
        assert old.decode(sources.old_ids[new_id]) == new.decode([new_id])
        assert torch.allclose(matrix[new_id], old_matrix[sources.old_ids[new_id]].mean(dim=0))
    assert torch.equal(matrix[ROLES["eos"]], old_matrix[ROLES["eos"]])


def test_a_byte_level_vocabulary_finds_its_tokens_in_a_sentencepiece_one():
    old, new = metaspace(ENGLISH), bpe(NORWEGIAN)
    sources = plan_rows(new, old, ROLES, ROLES)
    new_id = new.token_to_id("Ġthe")
    assert sources.kinds[new_id] == "copied" and sources.old_ids[new_id] == [old.token_to_id("\u2581the")]


def test_random_rows_follow_the_old_scale():
    old_matrix = torch.randn(300, 64) * 0.05
    matrix, counts = build_matrix(old_matrix, 1000, None, "random", torch.Generator().manual_seed(0))
    assert counts == {"random": 1000} and abs(matrix.std().item() - 0.05) < 0.005


def test_an_untied_head_gets_its_own_rows_and_the_body_is_kept(tmp_path):
    old, new = bpe(ENGLISH), bpe(NORWEGIAN)
    folders = {}
    for name, tokenizer in (("old", old), ("new", new)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        write_tokenizer_folder(folders[name], TrainedTokenizer(tokenizer), SpecialTokens())
    base = Transformer(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, ffn_size=64,
                                   vocab_size=old.get_vocab_size(), tie_embeddings=False, init_std=0.5))
    model, report = warm_started(base, folders["old"], old, folders["new"], new, "mean", 0)
    assert report["head"] == report["embedding"]
    new_id, old_id = new.token_to_id("Ġthe"), old.token_to_id("Ġthe")
    assert torch.equal(model.head.weight[new_id], base.head.weight[old_id])
    assert torch.equal(model.embedding.tokens.weight[new_id], base.embedding.tokens.weight[old_id])
    assert not torch.equal(model.head.weight[new_id], model.embedding.tokens.weight[new_id])
    for name, tensor in base.state_dict().items():
        if not name.startswith(("embedding.tokens", "head")):
            assert torch.equal(model.state_dict()[name], tensor)
    assert model.head.weight[new.get_vocab_size():].abs().sum() == 0
