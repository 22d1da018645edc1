"""The tokenizer's parts in-process: both backends, the SentencePiece conversion, the folder, the
scores, the sample."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter

import pytest
import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.tokenization.tokenizer_config import SpecialTokens, TokenizerConfig
from pipeline.progress import Progress
from pipeline.tokenization.extension import Spared, base_cuts, extend_bpe, pieces
from pipeline.tokenization.folder import (
    TrainingError,
    adopt_base_tokenizer,
    token_roles,
    write_tokenizer_folder,
)
from pipeline.tokenization.metrics import evaluate, tokens_per_word, word_spans
from pipeline.tokenization.sample import keeps, shares
from pipeline.tokenization.workers import batches
from pipeline.tokenization.training import (
    MAX_SENTENCE_BYTES,
    padded_vocab_size,
    sentences,
    train_tokenizer,
)
from tests.conftest import TRICKY_TEXTS

VOCAB = 2000  # rounded up to 2048
BACKENDS = {
    "bytelevel_bpe": dict(backend="bytelevel_bpe"),
    "sentencepiece_unigram": dict(backend="sentencepiece", sentencepiece_model_type="unigram"),
    "sentencepiece_bpe": dict(backend="sentencepiece", sentencepiece_model_type="bpe"),
}
# SentencePiece writes spaces as U+2581, so that character itself cannot come back.
META_SPACE_TEXT = "a literal \u2581 (U+2581) between words"


def quiet() -> Progress:
    """A progress count for the parts that take one; its log lines go unseen."""
    return Progress("test", None, "B", logging.getLogger(__name__))


@pytest.fixture(scope="module")
def training_text(embedded_records) -> list[str]:
    """About 1.5 MB of Norwegian (the embedded NPK sentences and statutes)."""
    docs = [r["text"] for r in embedded_records["nob"] if not r["id"].startswith("UD_")]
    picked, size = [], 0
    for text in docs:
        picked.append(text)
        size += len(text.encode("utf-8"))
        if size > 1_500_000:
            break
    return picked


@pytest.fixture(scope="module")
def unseen_text(embedded_records) -> list[str]:
    """UD test documents of six languages in five scripts, which the tokenizers never saw, and the
    tricky texts."""
    docs = [
        r["text"]
        for lang in ("nob", "eng", "rus", "ell", "ara", "hin", "fin", "mlt")
        for r in embedded_records[lang]
        if "/test/" in r["id"]
    ][::7]
    return docs + TRICKY_TEXTS


@pytest.fixture(scope="module")
def trained(training_text):
    """Each backend trained on the same text."""
    return {
        name: train_tokenizer(iter(training_text), TokenizerConfig(vocab_size=VOCAB, **options))
        for name, options in BACKENDS.items()
    }


def test_vocab_size_is_rounded_up_to_a_multiple_of_128(trained):
    assert [padded_vocab_size(n) for n in (261, 2000, 2048, 2049, 32000)] == [
        384,
        2048,
        2048,
        2176,
        32000,
    ]
    for result in trained.values():
        assert result.tokenizer.get_vocab_size() == 2048


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_tokens_are_ids_0_to_3_and_never_split(trained, backend):
    tokenizer = trained[backend].tokenizer
    assert [tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<unk>")] == [0, 1, 2, 3]
    ids = tokenizer.encode("slutt</s><s>start", add_special_tokens=False).ids
    assert 1 in ids and 0 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "sluttstart"


def test_special_tokens_are_configurable(training_text):
    special = SpecialTokens(bos="<|begin|>", eos="<|end|>", pad="<|pad|>", unk="<|unk|>")
    for options in BACKENDS.values():
        tokenizer = train_tokenizer(
            iter(training_text[:200]),
            TokenizerConfig(vocab_size=1024, special_tokens=special, **options),
        ).tokenizer
        assert [tokenizer.token_to_id(t) for t in special.in_id_order()] == [0, 1, 2, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_is_exact_and_nothing_is_unknown(trained, unseen_text, backend):
    tokenizer = trained[backend].tokenizer
    for text in unseen_text:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert 3 not in ids  # <unk>: bytes cover everything
    if backend == "bytelevel_bpe":
        ids = tokenizer.encode(META_SPACE_TEXT).ids
        assert tokenizer.decode(ids) == META_SPACE_TEXT
    else:  # the one documented exception
        ids = tokenizer.encode(META_SPACE_TEXT).ids
        assert tokenizer.decode(ids) == META_SPACE_TEXT.replace("\u2581", " ")


@pytest.mark.parametrize("backend", ["sentencepiece_unigram", "sentencepiece_bpe"])
def test_tokenizer_json_encodes_exactly_as_sentencepiece(trained, unseen_text, backend, tmp_path):
    from transformers import PreTrainedTokenizerFast

    result = trained[backend]
    processor = spm.SentencePieceProcessor(model_proto=result.sentencepiece_model)
    write_tokenizer_folder(tmp_path, result, SpecialTokens())
    reloaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in unseen_text + [META_SPACE_TEXT]:
        expected = processor.encode(text)
        assert reloaded.encode(text, add_special_tokens=False).ids == expected, text
        assert fast.encode(text, add_special_tokens=False) == expected, text
        assert processor.decode(expected) == reloaded.decode(expected)
    # The documented difference: written special tokens are special tokens in tokenizers, spelled
    # out in SentencePiece.
    assert reloaded.encode("a</s>b").ids != processor.encode("a</s>b")
    assert 1 in reloaded.encode("a</s>b").ids and 1 not in processor.encode("a</s>b")


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformers_loads_the_folder_and_encodes_identically(
    trained, unseen_text, backend, tmp_path
):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    result = trained[backend]
    write_tokenizer_folder(tmp_path, result, SpecialTokens())
    expected_files = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    if backend != "bytelevel_bpe":
        expected_files.add("tokenizer.model")
    assert {p.name for p in tmp_path.iterdir()} == expected_files
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(tmp_path))  # offline: a local folder
    assert (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id, auto.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    for text in unseen_text:
        ids = result.tokenizer.encode(text, add_special_tokens=False).ids
        assert fast.encode(text, add_special_tokens=False) == ids
        assert (
            auto.encode(text) == ids
        )  # no BOS/EOS added: the pack stage places document boundaries
        assert auto.decode(ids) == text


# -- keeping a base tokenizer with its own special tokens ------------------------------------------

END_OF_TEXT = "<|endoftext|>"


def gpt2_like_folder(folder, training_text, specials=(END_OF_TEXT,), **files) -> Tokenizer:
    """A base tokenizer folder: byte-level BPE with `specials` from id 0 (GPT-2: <|endoftext|>
    alone), and the JSON `files` given (name -> content)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        training_text[:50],
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return tokenizer


def test_keep_base_takes_the_bases_own_special_tokens_even_one_for_several_roles(
    training_text, tmp_path
):
    from transformers import AutoTokenizer

    # GPT-2's own files: one token is bos, eos and unk; no pad
    gpt2 = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
    base = gpt2_like_folder(
        tmp_path / "base", training_text, tokenizer_config={**gpt2, "model_max_length": 1024}
    )
    (tmp_path / "kept").mkdir()
    tokenizer, roles = adopt_base_tokenizer(tmp_path / "kept", str(tmp_path / "base"))
    assert roles == {"bos": END_OF_TEXT, "eos": END_OF_TEXT, "unk": END_OF_TEXT}
    assert tokenizer.to_str() == base.to_str()
    assert json.loads((tmp_path / "kept" / "special_tokens_map.json").read_text()) == gpt2
    assert token_roles(tmp_path / "kept", tokenizer) == {"bos": 0, "eos": 0, "pad": 0, "unk": 0}
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "kept"))
    assert (
        auto.eos_token == auto.bos_token == END_OF_TEXT
        and auto.encode("hei hei") == base.encode("hei hei").ids
    )


def test_keep_base_reads_the_roles_from_config_json_when_the_tokenizer_files_name_none(
    training_text, tmp_path
):
    # a model folder whose tokenizer_config names only bos, and whose config.json gives the ids
    # (Llama-like)
    gpt2_like_folder(
        tmp_path / "base",
        training_text,
        specials=("<|begin|>", "<|end|>", "<|pad|>"),
        tokenizer_config={"bos_token": "<|begin|>", "eos_token": "</s>"},
        config={"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": [2]},
    )
    (tmp_path / "kept").mkdir()
    _, roles = adopt_base_tokenizer(tmp_path / "kept", str(tmp_path / "base" / "tokenizer.json"))
    # `</s>` is not in the vocabulary: config.json's id decides; a list of ids is no single pad
    # token
    assert roles == {"bos": "<|begin|>", "eos": "<|end|>"}


def test_keep_base_refuses_a_base_without_an_end_of_text_token_and_names_what_to_add(
    training_text, tmp_path
):
    gpt2_like_folder(tmp_path / "base", training_text, tokenizer_config={"bos_token": END_OF_TEXT})
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError) as error:
        adopt_base_tokenizer(tmp_path / "kept", str(tmp_path / "base"))
    message = str(error.value)
    assert (
        "names no end-of-text token" in message
        and "pack stage ends every document with it" in message
    )
    assert (
        f'add "eos_token": "<the token>" to {tmp_path / "base" / "tokenizer_config.json"}'
        in message
    )
    assert f"its special tokens are {END_OF_TEXT}" in message
    assert not list((tmp_path / "kept").iterdir())  # nothing adopted


# -- extending a base tokenizer --------------------------------------------------------------------


def english_base(english: list[str]) -> Tokenizer:
    """An English base of 1,000 tokens, as a real base is (GPT-2-like: byte-level, one end-of-text
    token)."""
    base = Tokenizer(models.BPE())
    base.pre_tokenizer, base.decoder = (
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        decoders.ByteLevel(),
    )
    base.train_from_iterator(
        english,
        trainers.BpeTrainer(
            vocab_size=1000,
            special_tokens=[END_OF_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return base


def test_extending_a_base_keeps_its_tokens_and_joins_them_with_merges_learnt_on_its_own_cuts(
    training_text, embedded_records
):
    from pipeline.warmup.transfer import plan_rows

    english = [r["text"] for r in embedded_records["eng"]][:300]
    base = english_base(english)
    cut = len(training_text) * 3 // 4
    norwegian, unseen = training_text[:cut], training_text[cut:]
    extended, added = extend_bpe(base, base_cuts(base, norwegian, 1, quiet()), 500, min_frequency=2)

    assert added == {
        "base_tokens": 1000,
        "merges": 500,
        "added_tokens": 500 - added["existing"],
        "existing": added["existing"],
        "left_out": 0,
    }
    assert extended.get_vocab_size() == 1000 + added["added_tokens"] > 1400
    for token, token_id in base.get_vocab().items():  # every base token keeps its id
        assert extended.token_to_id(token) == token_id
    # Norwegian it never saw takes far fewer tokens; every text decodes back exactly
    tokens = [sum(len(t.encode(text).ids) for text in unseen) for t in (base, extended)]
    assert tokens[1] < 0.85 * tokens[0]
    for text in unseen + english[:50] + TRICKY_TEXTS:
        assert extended.decode(extended.encode(text).ids) == text
    # a word is first cut as the base cuts it, then only new merges join its pieces: where none
    # applies, the cut is the base's (most English words), and every new token spells a run of the
    # base's tokens
    english_words = {
        word for text in english[:100] for word, _ in base.pre_tokenizer.pre_tokenize_str(text)
    }
    kept = 0
    for word in english_words:
        old, new = (
            [t.value for t in base.model.tokenize(word)],
            [t.value for t in extended.model.tokenize(word)],
        )
        assert "".join(old) == "".join(new) and len(new) <= len(old)
        kept += old == new
    assert kept > 0.85 * len(english_words)  # 89% with this small base (1,000 tokens)
    # the warm start copies every base token's row to the same id and builds the new ones from the
    # base's pieces
    plan = plan_rows(extended, base, {"eos": 0}, {"eos": 0})
    assert all(
        plan.rows[i].kind == "copied" and plan.rows[i].old_ids == (i,) for i in range(1, 1000)
    )
    assert {plan.rows[i].kind for i in range(1000, extended.get_vocab_size())} == {"averaged"}


def test_an_extension_leaves_out_the_tokens_that_the_spared_text_uses(
    training_text, embedded_records
):
    english = [r["text"] for r in embedded_records["eng"]]
    base = english_base(english[:300])
    norwegian, spared_english, unseen_english = training_text, english[300:600], english[600:]
    words = base_cuts(base, norwegian, 1, quiet())
    plain, _ = extend_bpe(base, words, 300, min_frequency=2)
    spared_pieces = Spared(
        pieces(base, spared_english, 1, quiet()), pieces(base, norwegian, 1, quiet()), 0.01
    )
    spared, added = extend_bpe(base, words, 300, min_frequency=2, spared=spared_pieces)

    def uses(tokenizer, texts):  # added-token ids in the texts, per byte
        ids = [
            i
            for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)
            for i in encoding.ids
        ]
        return Counter(i for i in ids if i >= 1000), sum(
            len(text.encode("utf-8")) for text in texts
        )

    # no added token is used as often as a hundredth of the Norwegian rate in the spared text; the
    # learnt merges after the left-out ones took their places
    (english_uses, english_bytes), (norwegian_uses, norwegian_bytes) = (
        uses(spared, texts) for texts in (spared_english, norwegian)
    )
    assert added["left_out"] > 0 and english_uses
    assert all(
        count * norwegian_bytes < 0.01 * norwegian_uses[i] * english_bytes
        for i, count in english_uses.items()
    )
    assert added["merges"] == 300 and spared.get_vocab_size() == 1000 + added["added_tokens"]
    # no merge needs a token left out: every merge joins two tokens of the vocabulary
    vocab = spared.get_vocab()
    merges = json.loads(spared.to_str())["model"]["merges"]
    assert all(
        left in vocab and right in vocab and left + right in vocab
        for left, right in (m.split(" ") if isinstance(m, str) else m for m in merges)
    )
    # English it never saw is cut anew far less often, Norwegian still cut into fewer tokens than by
    # the base
    assert sum(uses(spared, unseen_english)[0].values()) < 0.5 * sum(
        uses(plain, unseen_english)[0].values()
    )
    assert sum(uses(spared, norwegian)[0].values()) > 0.5 * sum(uses(plain, norwegian)[0].values())


def test_the_work_on_text_adds_up_the_same_on_one_process_and_on_three(
    training_text, embedded_records
):
    """The Python-bound parts of the tokenizer stage run in batches on `workers` processes: the
    base's cuts that the added merges learn from, the spared text's pieces, the report's scores.
    tests/stages/test_pack_stage.py runs the stages both ways."""
    english = [r["text"] for r in embedded_records["eng"]]
    base, spared, heldout = english_base(english[:300]), english[300:600], english[600:700]
    assert len(list(batches(training_text))) > 1  # more than one process has work
    one, three = (quiet() for _ in range(2))
    words = base_cuts(base, training_text, 1, one), base_cuts(base, training_text, 3, three)
    assert words[0] == words[1] and list(words[0]) == list(words[1])  # same counts, same order
    assert one.done == three.done == sum(len(text.encode("utf-8")) for text in training_text)
    assert pieces(base, spared, 1, quiet()) == pieces(base, spared, 3, quiet())
    scores = [evaluate({"base": base}, heldout, RegexWords(), n, quiet()) for n in (1, 3)]
    assert scores[0] == scores[1] and scores[0]["base"].documents == len(heldout)


def test_extending_refuses_a_base_that_is_not_bpe():
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0))
    with pytest.raises(TrainingError, match="adds BPE merges, but the base tokenizer is Unigram"):
        extend_bpe(unigram, Counter(), 10, min_frequency=1)


def test_nfkc_folds_compatibility_characters_and_breaks_the_round_trip(training_text):
    nfkc = train_tokenizer(
        iter(training_text[:300]), TokenizerConfig(vocab_size=1024, normalization="nfkc")
    ).tokenizer
    ids = nfkc.encode("ﬁnne １２ x²").ids
    assert nfkc.decode(ids) == "finne 12 x2"


def test_training_is_deterministic(training_text):
    for options in BACKENDS.values():
        config = TokenizerConfig(vocab_size=1024, **options)
        first, second = (train_tokenizer(iter(training_text[:400]), config) for _ in range(2))
        assert first.tokenizer.to_str() == second.tokenizer.to_str()
        assert first.sentencepiece_model == second.sentencepiece_model


def test_max_token_length_bounds_the_learned_tokens(training_text):
    options = TokenizerConfig(vocab_size=1024, max_token_length=4)
    tokenizer = train_tokenizer(iter(training_text[:400]), options).tokenizer
    learned = [token for token, token_id in tokenizer.get_vocab().items() if token_id > 3]
    assert max(len(token) for token in learned) == 4  # byte-level characters: one per byte


def test_pretokenizer_pattern_keeps_combining_marks_inside_words(trained):
    pre_tokenizer = trained["bytelevel_bpe"].tokenizer.pre_tokenizer
    pieces = [piece for piece, _ in pre_tokenizer.pre_tokenize_str("ne\u0301e नमस्ते 12345")]
    decoded = [decoders.ByteLevel().decode([p]) for p in pieces]
    assert decoded == ["ne\u0301e", " नमस्ते", " ", "123", "45"]


def test_sentencepiece_gets_lines_in_chunks_it_keeps():
    long_line = "ord " * MAX_SENTENCE_BYTES
    got = list(sentences(["første linje\n\n   \nandre linje", long_line]))
    assert got[:2] == ["første linje", "andre linje"]
    assert "".join(got[2:]) == long_line and all(
        len(s.encode("utf-8")) <= MAX_SENTENCE_BYTES for s in got[2:]
    )


# -- the scores, on tokenizations counted by hand --------------------------------------------------


class RegexWords:
    """A word tokenizer for the hand-counted examples: words and punctuation."""

    def word_tokenize(self, text: str) -> list[str]:
        return re.findall(r"\w+|[^\w\s]", text)


def _word_level(pattern: str, text: str, decoder=None) -> Tokenizer:
    """Tokens are the pre-tokens of `pattern`: a tokenization known in advance."""
    pieces = sorted(
        {
            piece
            for piece, _ in pre_tokenizers.Split(Regex(pattern), "isolated").pre_tokenize_str(text)
        }
    )
    tokenizer = Tokenizer(
        models.WordLevel(
            {
                **{p: i for i, p in enumerate(pieces)},
                "[UNK]": len(pieces),
                "unused": len(pieces) + 1,
            },
            unk_token="[UNK]",
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    if decoder is not None:
        tokenizer.decoder = decoder
    return tokenizer


def test_word_spans_and_tokens_per_word_by_hand():
    text = "Det var en gang, sa hun."
    spans = word_spans(text, RegexWords().word_tokenize(text))
    assert spans.tolist() == [
        [0, 3],
        [4, 7],
        [8, 10],
        [11, 15],
        [17, 19],
        [20, 23],
    ]  # no `,` or `.`
    # tokens: "Det", " v", "ar", " en", " gang" (its space overlaps nothing), ",", " sa", " hun",
    # "."
    offsets = [(0, 3), (3, 5), (5, 7), (7, 10), (10, 15), (15, 16), (16, 19), (19, 23), (23, 24)]
    assert tokens_per_word(spans, offsets).tolist() == [1, 2, 1, 1, 1, 1]
    # byte tokens of one character share its offsets: each counts
    assert tokens_per_word(word_spans("bø", ["bø"]), [(0, 1), (1, 2), (1, 2)]).tolist() == [3]


def test_scores_of_known_tokenizations():
    text = "Det var en gang."  # 16 bytes; words Det, var, en, gang (the `.` is punctuation)
    words_and_spaces = _word_level(
        r"\w+|\s+|[^\w\s]", text
    )  # 8 tokens; decodes with spaces between tokens
    characters = _word_level(r".", text, decoders.Fuse())  # 16 tokens; decodes exactly
    scores = evaluate(
        {"words": words_and_spaces, "chars": characters}, [text], RegexWords(), 1, quiet()
    )
    words = scores["words"].summary()
    assert (words["fertility"], words["continued_words"], words["bytes_per_token"]) == (
        1.0,
        0.0,
        2.0,
    )
    assert words["vocab_used"] == 6 / 8 and words["roundtrip_rate"] == 0.0
    chars = scores["chars"].summary()
    assert chars["fertility"] == (3 + 3 + 2 + 4) / 4 and chars["continued_words"] == 1.0
    assert chars["bytes_per_token"] == 1.0 and chars["roundtrip_rate"] == 1.0
    assert chars["words"] == 4 and chars["tokens"] == 16 and chars["documents"] == 1


# -- the sample ------------------------------------------------------------------------------------


def _plan_source(name: str, epochs: float, unique_bytes: int) -> dict:
    return {"name": name, "epochs": epochs, "unique_bytes": unique_bytes}


def test_shares_follow_the_planned_bytes_and_repeat_nothing():
    plan = [_plan_source("nob", 4, 100), _plan_source("eng", 2, 1000), _plan_source("code", 0, 500)]
    # planned bytes 400 + 2000; no document repeated: the total is 2400 / 4 epochs = 600
    nob, eng, code = shares(plan, sample_bytes=10**9)
    assert (nob.cap_bytes, nob.keep_probability) == (None, 1.0)  # all of nob, once
    assert (eng.cap_bytes, eng.keep_probability) == (500, 0.5)
    assert (code.cap_bytes, code.keep_probability) == (0, 0.0)  # no planned tokens, nothing
    nob, eng, _ = shares(plan, sample_bytes=120)
    assert (nob.cap_bytes, eng.cap_bytes) == (20, 100)
    assert (nob.keep_probability, eng.keep_probability) == pytest.approx((0.2, 0.1))


def test_documents_are_kept_by_a_seeded_hash_of_their_id():
    ids = [f"doc/{i}" for i in range(20_000)]
    kept = [i for i in ids if keeps(1, "nob", i, 0.25)]
    assert len(kept) == pytest.approx(5_000, rel=0.05)
    assert kept == [i for i in ids if keeps(1, "nob", i, 0.25)]
    assert kept != [i for i in ids if keeps(2, "nob", i, 0.25)]
    assert all(keeps(7, "nob", i, 1.0) for i in ids[:100]) and not any(
        keeps(7, "nob", i, 0.0) for i in ids[:100]
    )
