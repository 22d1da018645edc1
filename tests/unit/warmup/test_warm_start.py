"""The embedding transfer of the warm start, on small tokenizers trained here."""

from __future__ import annotations

import gzip
import json
import resource

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.config import REPO_ROOT, PipelineConfig, validate
from pipeline.errors import ConfigError, StageError
from pipeline.languages import LANGUAGES, language_config
from pipeline.model.model_config import ModelConfig
from pipeline.model.model_tensors import ModuleTensors, build_model
from pipeline.model.transformer import Transformer
from pipeline.tokenization.tokenizer_config import SpecialTokens, TokenizerConfig
from pipeline.tokenization.folder import TrainedTokenizer, write_tokenizer_folder
from pipeline.tokenization.surfaces import spelling, token_bytes
from pipeline.tokenization.training import train_tokenizer
from pipeline.warmup.initialise import (
    leading_base_rows,
    resident_bytes,
    transfer_plan,
    warm_started,
    warmup_trainable,
)
from pipeline.warmup.transfer import build_matrix, plan_rows

ENGLISH = ["the king had three daughters and a house by the sea"] * 50 + [
    "she walked home in the rain"
] * 50
NORWEGIAN = ["kongen hadde tre døtre og et hus ved sjøen"] * 50 + [
    "hun gikk hjem i regnet, the end"
] * 50
ROLES = {"bos": 0, "eos": 1, "pad": 2, "unk": 3}


def bpe(texts: list[str], vocab: int = 512) -> Tokenizer:
    return train_tokenizer(texts, TokenizerConfig(vocab_size=vocab)).tokenizer


def metaspace(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=120, special_tokens=SpecialTokens().in_id_order())
    )
    return tokenizer


def embedded_text(lang: str, characters: int) -> list[str]:
    """The first documents of the embedded sample of `lang`, about `characters` long."""
    texts, size = [], 0
    for path in sorted((REPO_ROOT / "data" / lang).glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                texts.append(json.loads(line)["text"])
                size += len(texts[-1])
                if size >= characters:
                    return texts
    return texts


def folder_of(path, tokenizer: Tokenizer):
    path.mkdir()
    write_tokenizer_folder(path, TrainedTokenizer(tokenizer), SpecialTokens())
    return path


@pytest.fixture(scope="module")
def transfer(tmp_path_factory):
    """An English and a Norwegian tokenizer (as folders) trained on the embedded samples."""
    root = tmp_path_factory.mktemp("transfer")
    old, new = bpe(embedded_text("eng", 150_000), 800), bpe(embedded_text("nob", 150_000), 800)
    return {
        "old": old,
        "new": new,
        "old_dir": folder_of(root / "old", old),
        "new_dir": folder_of(root / "new", new),
    }


def plan_of(transfer, method: str):
    return transfer_plan(
        transfer["old_dir"], transfer["old"], transfer["new_dir"], transfer["new"], method
    )


def test_token_bytes_reads_both_spellings():
    assert token_bytes("Ġhus", "byte_level") == b" hus"
    assert token_bytes("Ã¸", "byte_level") == "ø".encode("utf-8")
    assert token_bytes("\u2581hus", "metaspace") == b" hus"
    assert token_bytes("<0xC3>", "metaspace") == b"\xc3"
    assert spelling(bpe(ENGLISH)) == "byte_level" and spelling(metaspace(ENGLISH)) == "metaspace"


def test_mean_rows_copy_shared_tokens_and_average_the_pieces_of_new_ones():
    old, new = bpe(ENGLISH), bpe(NORWEGIAN)
    plan = plan_rows(new, old, ROLES, ROLES)
    old_matrix = torch.randn(old.get_vocab_size(), 8)
    matrix, counts = build_matrix(
        old_matrix, new.get_vocab_size(), plan, "mean", torch.Generator().manual_seed(0)
    )
    assert counts["special"] == 4 and counts["copied"] > 0 and counts["averaged"] > 0
    for token in ("Ġthe", "e"):
        new_id, old_id = new.token_to_id(token), old.token_to_id(token)
        assert plan.rows[new_id].kind == "copied" and torch.equal(
            matrix[new_id], old_matrix[old_id]
        )
    averaged = [i for i in plan.ids_of("averaged") if len(plan.rows[i].old_ids) > 1]
    assert averaged
    for new_id in averaged[:20]:
        old_ids = list(plan.rows[new_id].old_ids)
        assert old.decode(old_ids) == new.decode([new_id])
        assert torch.allclose(matrix[new_id], old_matrix[old_ids].mean(dim=0), atol=1e-6)
    assert torch.equal(matrix[ROLES["eos"]], old_matrix[ROLES["eos"]])


def test_special_tokens_without_a_role_keep_their_rows_and_the_base_rows_lead():
    """SmolLM2's <repo_name>, <file_sep> ... are special but name no role: an extended base
    tokenizer keeps them at their ids, and the warm start copies their rows rather than drawing them
    at random."""
    base = bpe(ENGLISH)
    base.add_special_tokens(["<repo_name>", "<file_sep>"])
    extended = Tokenizer.from_str(base.to_str())
    extended.add_special_tokens(["<new_special>"])
    plan = plan_rows(extended, base, ROLES, ROLES)
    for token in ("<repo_name>", "<file_sep>"):
        row = plan.rows[extended.token_to_id(token)]
        assert row.kind == "special" and row.old_ids == (base.token_to_id(token),)
    assert (
        extended.token_to_id("<new_special>") not in plan.rows
    )  # nothing of the base's to copy: drawn at random
    assert leading_base_rows(plan) == base.get_vocab_size()


def test_a_byte_level_vocabulary_finds_its_tokens_in_a_sentencepiece_one():
    old, new = metaspace(ENGLISH), bpe(NORWEGIAN)
    plan = plan_rows(new, old, ROLES, ROLES)
    new_id = new.token_to_id("Ġthe")
    assert plan.rows[new_id].kind == "copied" and plan.rows[new_id].old_ids == (
        old.token_to_id("\u2581the"),
    )


def test_random_rows_follow_the_old_scale():
    old_matrix = torch.randn(300, 64) * 0.05
    matrix, counts = build_matrix(
        old_matrix, 1000, None, "random", torch.Generator().manual_seed(0)
    )
    assert counts == {"random": 1000} and abs(matrix.std().item() - 0.05) < 0.005


def test_the_mean_init_copies_shared_rows_and_builds_finite_deterministic_new_ones(transfer):
    plan = plan_of(transfer, "mean")
    assert plan.rows == plan_of(transfer, "mean").rows
    old_matrix = torch.randn(
        transfer["old"].get_vocab_size(), 16, generator=torch.Generator().manual_seed(3)
    )
    matrix, counts = build_matrix(
        old_matrix, transfer["new"].get_vocab_size(), plan, "mean", torch.Generator().manual_seed(0)
    )
    assert torch.isfinite(matrix).all()
    copied = plan.ids_of("copied")
    assert len(copied) > 100
    for new_id in copied:
        assert torch.equal(matrix[new_id], old_matrix[plan.rows[new_id].old_ids[0]])
    built = plan.ids_of("averaged")
    assert len(built) > 100 and counts["averaged"] == len(built)
    for new_id in built:
        row = plan.rows[new_id]
        assert abs(sum(row.weights) - 1) < 1e-5 and min(row.weights) > 0
        expected = sum(w * old_matrix[i] for i, w in zip(row.old_ids, row.weights))
        assert torch.allclose(matrix[new_id], expected, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_heads_get_the_planned_rows_and_the_body_is_kept(transfer, tied):
    old, new = transfer["old"], transfer["new"]
    base = Transformer(
        ModelConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            ffn_size=64,
            vocab_size=old.get_vocab_size(),
            tie_embeddings=tied,
            init_std=0.5,
        )
    )
    before = resident_bytes() / 2**20
    started, summary = warm_started(
        ModuleTensors(base), transfer["old_dir"], old, transfer["new_dir"], new, "mean", 0
    )
    highest = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    model = build_model(started)
    cost = summary["cost"]
    assert summary["method"] == "mean" and cost["seconds"] > 0
    # the process's resident set, sampled: from where it started up to no more than the process's
    # own peak, and the added memory measured from that start
    assert before - 1 <= cost["peak_rss_mib"] <= highest + 1, (before, cost, highest)
    assert cost["peak_rss_mib"] - cost["peak_added_mib"] == pytest.approx(before, abs=2), (
        before,
        cost,
    )
    new_id = next(i for i in plan_of(transfer, "mean").ids_of("copied") if len(new.decode([i])) > 2)
    old_id = old.token_to_id(new.id_to_token(new_id))
    assert torch.equal(model.embedding.tokens.weight[new_id], base.embedding.tokens.weight[old_id])
    if tied:
        assert "head" not in summary and model.head.weight is model.embedding.tokens.weight
    else:
        assert summary["head"] == summary["embedding"]
        assert torch.equal(model.head.weight[new_id], base.head.weight[old_id])
        assert not torch.equal(model.head.weight[new_id], model.embedding.tokens.weight[new_id])
        assert model.head.weight[new.get_vocab_size() :].abs().sum() == 0
    for name, tensor in base.state_dict().items():
        if not name.startswith(("embedding.tokens", "head")):
            assert torch.equal(model.state_dict()[name], tensor)
    assert torch.isfinite(model.embedding.tokens.weight).all()


def test_a_base_tokenizer_that_shares_nothing_fails_clearly_unless_random(transfer, tmp_path):
    cyrillic = Tokenizer(models.WordLevel({"привет": 0, "мир": 1, "<unk>": 2}, unk_token="<unk>"))
    cyrillic.pre_tokenizer = pre_tokenizers.Whitespace()
    cyrillic.add_special_tokens(["<unk>"])
    with pytest.raises(StageError, match="shares no token.*warmup.init=random"):
        transfer_plan(tmp_path, cyrillic, transfer["new_dir"], transfer["new"], "mean")
    assert transfer_plan(tmp_path, cyrillic, transfer["new_dir"], transfer["new"], "random") is None


def test_the_warmup_trains_the_embeddings_and_what_the_switches_add():
    names = [
        "embedding.tokens.weight",
        "embedding.norm.weight",
        "blocks.0.attn_norm.weight",
        "blocks.0.attn.q.weight",
        "blocks.0.mlp_norm.weight",
        "blocks.0.mlp.up.weight",
        "final_norm.weight",
        "head.weight",
    ]

    def trained(**switches):
        prefixes = tuple(
            warmup_trainable(**{"train_head": True, "train_embedding_norm": False, **switches})
        )
        return [name for name in names if name.startswith(prefixes)]

    assert trained() == ["embedding.tokens.weight", "head.weight"]
    assert trained(train_head=False) == ["embedding.tokens.weight"]
    assert trained(train_embedding_norm=True) == [
        "embedding.tokens.weight",
        "embedding.norm.weight",
        "head.weight",
    ]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("init", "focus", "Allowed: mean, random"),
        ("train_head", False, "a tied head is the input embedding"),
    ],
)
def test_bad_warmup_settings_fail_at_start_naming_the_key(key, value, message):
    cfg = PipelineConfig(stage="warmup", lang=language_config("nob", LANGUAGES["nob"]))
    cfg.tokenizer.extend_base = False  # no model.base to extend here (the base-model rule)
    setattr(cfg.warmup, key, value)
    with pytest.raises(ConfigError, match=rf"`warmup.{key}`.*{message}"):
        validate(cfg)
