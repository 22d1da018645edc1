"""The tokenizer stage through the real CLI, on the embedded samples cleaned and mixed by the real
stages."""

from __future__ import annotations

import gzip
import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.packing.sampler import PackedSampler
from tests.conftest import TRICKY_TEXTS, copy_of, marker, read_jsonl_gz, run_cli

VOCAB = "tokenizer.vocab_size=2048"
# Held-out text in four more scripts than nob and eng: Cyrillic, Devanagari, Arabic; Finnish for
# Latin.
OTHER_LANGS = ("rus", "hin", "ara", "fin")


def report(cwd, lang: str = "nob") -> dict:
    return json.loads(
        (cwd / "work" / lang / "tokenizer" / "report.json").read_text(encoding="utf-8")
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, nob_eng_cleaned):
    """nob and eng cleaned and mixed; an English tokenizer; nob's, SentencePiece (kept aside) then
    byte-level BPE."""
    cwd = copy_of(nob_eng_cleaned, tmp_path_factory, "tokenizer")
    # UD documents are short (hence min_doc_words), and small languages need a larger held-out
    # share.
    run_cli(
        "-m",
        "stage=clean",
        f"lang={','.join(OTHER_LANGS)}",
        "clean.gopher_min_doc_words=5",
        "clean.heldout_fraction=0.2",
        cwd=cwd,
    )
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda lang: run_cli("stage=mix", f"lang={lang}", cwd=cwd), ("nob", "eng")))
        english = pool.submit(run_cli, "stage=tokenizer", "lang=eng", VOCAB, cwd=cwd)
        run_cli(
            "stage=tokenizer",
            "lang=nob",
            VOCAB,
            "tokenizer.backend=sentencepiece",
            "workers=2",
            cwd=cwd,
        )
        shutil.copytree(cwd / "work" / "nob" / "tokenizer", cwd / "sentencepiece_nob")
        english.result()
    result = run_cli(
        "stage=tokenizer",
        "lang=nob",
        VOCAB,
        "tokenizer.base=work/eng/tokenizer/tokenizer.json",
        cwd=cwd,
    )
    return cwd, result


def test_acceptance_the_nob_tokenizer_fits_nob_better_than_an_english_one(trained):
    cwd, result = trained
    document = report(cwd)
    new, base = document["new"]["scores"], document["base"]["scores"]
    assert document["tokenizer"]["vocab_size"] == document["base"]["scores"]["vocab_size"] == 2048
    assert new["fertility"] < base["fertility"]
    assert (
        new["continued_words"] < base["continued_words"]
        and new["bytes_per_token"] > base["bytes_per_token"]
    )
    assert new["roundtrip_rate"] == base["roundtrip_rate"] == 1.0
    assert document["new_vs_base"]["fertility"] == pytest.approx(
        new["fertility"] / base["fertility"]
    )
    # inside the work folder: recorded relative to it, as the contract records paths
    assert document["base"]["path"] == "${work_dir}/eng/tokenizer/tokenizer.json"
    # evaluated on all of nob's held-out text, split into words by nob's word tokenizer
    heldout = read_jsonl_gz(cwd / "work" / "nob" / "clean" / "heldout")
    assert new["documents"] == base["documents"] == len(heldout) > 0
    assert new["bytes"] == sum(len(r["text"].encode("utf-8")) for r in heldout)
    assert (
        new["words"] == base["words"] > new["documents"]
        and document["heldout"]["word_tokenizer"] == "nob_Latn"
    )

    table = [
        line
        for line in (cwd / "work" / "nob" / "tokenizer" / "report.md").read_text().splitlines()
        if line.startswith("| fertility")
    ]
    assert table == [
        f"| fertility (tokens per word) | {new['fertility']:.3f} | {base['fertility']:.3f} | "
        f"{new['fertility'] / base['fertility']:.3f} |"
    ]
    assert table[0] in result.stderr  # the table is in the log too
    metrics = marker(cwd / "work", "nob", "tokenizer")["metrics"]
    for key in ("fertility", "bytes_per_token", "continued_words", "vocab_used", "roundtrip_rate"):
        assert metrics["new"][key] == new[key] and metrics["base"][key] == base[key]


def test_the_sample_is_the_plans_training_text_and_never_the_heldout_split(trained):
    cwd, _ = trained
    sample = report(cwd)["sample"]
    nob, eng = sample["sources"]
    train = read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")
    plan = {
        s["name"]: s
        for s in json.loads((cwd / "work" / "nob" / "mix" / "plan.json").read_text())["sources"]
    }
    # the default plan: nob at 4 epochs, English replayed at its share: all of nob's training text
    # once, and each English document with the probability of its epochs against nob's
    assert (
        nob["name"] == "nob"
        and nob["keep_probability"] == 1.0
        and nob["folder"].endswith("nob/clean/train")
    )
    assert nob["documents"] == len(train) and nob["bytes"] == sum(
        len(r["text"].encode("utf-8")) for r in train
    )
    assert eng["name"] == "eng" and eng["folder"].endswith("eng/clean/train")
    assert eng["keep_probability"] == pytest.approx(plan["eng"]["epochs"] / plan["nob"]["epochs"])
    assert (
        0
        < eng["documents"]
        < eng["documents_read"]
        == len(read_jsonl_gz(cwd / "work" / "eng" / "clean" / "train"))
    )
    assert (
        sample["bytes"]
        == nob["bytes"] + eng["bytes"]
        == marker(cwd / "work", "nob", "tokenizer")["metrics"]["sample_bytes"]
    )
    heldout = {
        r["text"]
        for lang in ("nob", "eng")
        for r in read_jsonl_gz(cwd / "work" / lang / "clean" / "heldout")
    }
    assert heldout and not heldout & {
        r["text"] for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")
    }


def test_a_larger_budget_brings_english_into_the_sample_in_the_plans_proportions(trained, tmp_path):
    cwd, _ = trained
    shutil.copytree(cwd / "work", tmp_path / "work")
    unique = json.loads((cwd / "work" / "nob" / "mix" / "plan.json").read_text())["sources"][0][
        "unique_tokens_est"
    ]
    run_cli("stage=mix", "lang=nob", f"mix.tokens={6 * unique}", cwd=tmp_path)
    run_cli(
        "stage=tokenizer",
        "lang=nob",
        "tokenizer.vocab_size=1024",
        "tokenizer.sample_bytes=1000000",
        cwd=tmp_path,
    )
    plan = {
        s["name"]: s
        for s in json.loads((tmp_path / "work" / "nob" / "mix" / "plan.json").read_text())[
            "sources"
        ]
    }
    sources = {s["name"]: s for s in report(tmp_path)["sample"]["sources"]}
    assert plan["eng"]["tokens"] > 0 and 0 < sources["eng"]["keep_probability"] < 1
    assert sum(s["bytes"] for s in sources.values()) <= 1_000_000
    for name in ("nob", "eng"):
        planned = plan[name]["epochs"] * plan[name]["unique_bytes"]
        assert sources[name]["planned_bytes"] == round(planned)
        assert sources[name]["bytes"] <= sources[name]["cap_bytes"]
        # documents are whole, so a share is met to within a few documents
        share = planned / sum(p["epochs"] * p["unique_bytes"] for p in plan.values())
        assert sources[name]["bytes"] == pytest.approx(share * 1_000_000, rel=0.15)


def test_both_backends_write_a_folder_transformers_loads_with_identical_encodings(trained):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cwd, _ = trained
    heldout = [r["text"] for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "heldout")]
    for folder in (cwd / "work" / "nob" / "tokenizer", cwd / "sentencepiece_nob"):
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        auto = AutoTokenizer.from_pretrained(str(folder))
        assert tokenizer.get_vocab_size() == len(fast) == 2048
        assert fast.convert_tokens_to_ids(["<s>", "</s>", "<pad>", "<unk>"]) == [0, 1, 2, 3] and (
            auto.bos_token_id,
            auto.eos_token_id,
            auto.pad_token_id,
            auto.unk_token_id,
        ) == (0, 1, 2, 3)
        for text in heldout + TRICKY_TEXTS:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            assert fast.encode(text, add_special_tokens=False) == auto.encode(text) == ids
    sentencepiece = spm.SentencePieceProcessor(
        model_file=str(cwd / "sentencepiece_nob" / "tokenizer.model")
    )
    tokenizer = Tokenizer.from_file(str(cwd / "sentencepiece_nob" / "tokenizer.json"))
    for text in heldout + TRICKY_TEXTS:
        assert sentencepiece.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
    document = json.loads((cwd / "sentencepiece_nob" / "report.json").read_text())
    assert document["tokenizer"]["backend"] == "sentencepiece"
    assert document["tokenizer"]["sentencepiece_model_type"] == "unigram"
    assert (
        document["new"]["scores"]["roundtrip_rate"] == 1.0
        and "tokenizer.model" in document["tokenizer"]["files"]
    )


def test_round_trip_is_exact_on_heldout_text_of_six_languages(trained):
    cwd, _ = trained
    texts = {}
    for lang in ("nob", "eng", *OTHER_LANGS):
        texts[lang] = [r["text"] for r in read_jsonl_gz(cwd / "work" / lang / "clean" / "heldout")]
        assert texts[lang], f"no held-out text for {lang}"
    texts["tricky"] = TRICKY_TEXTS
    for folder in (cwd / "work" / "nob" / "tokenizer", cwd / "sentencepiece_nob"):
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        for lang, documents in texts.items():
            for text in documents:
                ids = tokenizer.encode(text, add_special_tokens=False).ids
                assert tokenizer.decode(ids, skip_special_tokens=False) == text, (
                    folder.name,
                    lang,
                    text[:80],
                )
                assert 3 not in ids  # nothing is <unk>


def test_same_command_is_skipped_and_a_new_vocab_size_retrains(trained, tmp_path):
    cwd, _ = trained
    before = marker(cwd / "work", "eng", "tokenizer")
    again = run_cli("stage=tokenizer", "lang=eng", VOCAB, cwd=cwd)
    assert "Skipping tokenizer for eng: it is up to date" in again.stderr
    assert marker(cwd / "work", "eng", "tokenizer") == before
    # retrained in a copy, so that nob's base tokenizer stays as it is
    shutil.copytree(cwd / "work" / "eng", tmp_path / "work" / "eng")
    changed = run_cli("stage=tokenizer", "lang=eng", "tokenizer.vocab_size=1000", cwd=tmp_path)
    assert (
        "tokenizer for eng changed" in changed.stderr
        and "vocab_size 1000 rounded up to 1024" in changed.stderr
    )
    after = marker(tmp_path / "work", "eng", "tokenizer")
    assert after["config_hash"] != before["config_hash"] and after["metrics"]["vocab_size"] == 1024
    assert (
        Tokenizer.from_file(
            str(tmp_path / "work" / "eng" / "tokenizer" / "tokenizer.json")
        ).get_vocab_size()
        == 1024
    )


def test_keep_base_adopts_the_base_tokenizer_and_pack_and_pretrain_from_the_base_accept_it(
    trained, english_base, tmp_path
):
    cwd, _ = trained
    for lang in ("nob", "eng"):  # its plan reads the copy's clean outputs (English: the replay)
        shutil.copytree(cwd / "work" / lang, tmp_path / "work" / lang)
    run_cli(
        "stage=tokenizer",
        "lang=nob",
        "tokenizer.keep_base=true",
        f"model.base={english_base}",
        cwd=tmp_path,
    )
    folder = tmp_path / "work" / "nob" / "tokenizer"
    assert (folder / "tokenizer.json").read_bytes() == (
        english_base / "tokenizer.json"
    ).read_bytes()
    special = json.loads((folder / "special_tokens_map.json").read_text())
    assert special == {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    document = report(tmp_path)
    assert document["tokenizer"]["kept_base"] == str((english_base / "tokenizer.json").resolve())
    assert (
        document["sample"] is None and document["base"] is None
    )  # nothing trained, nothing to compare
    assert document["new"]["scores"]["documents"] > 0 and document["tokenizer"]["vocab_size"] == 512
    assert "Nothing was trained" in (folder / "report.md").read_text()
    assert (
        marker(tmp_path / "work", "nob", "tokenizer")["metrics"]["kept_base"]
        == document["tokenizer"]["kept_base"]
    )

    run_cli("stage=pack", "lang=nob", cwd=tmp_path)
    assert marker(tmp_path / "work", "nob", "pack")["metrics"]["vocab_size"] == 512
    run_cli(
        "stage=pretrain",
        "lang=nob",
        "init=hf",
        f"model.base={english_base}",
        "model.num_layers=2",
        "model.max_seq_len=128",
        "train.steps=2",
        "train.warmup_steps=1",
        "train.global_batch_size=2",
        "train.micro_batch_size=2",
        "train.eval_tokens=256",
        cwd=tmp_path,
    )
    assert marker(tmp_path / "work", "nob", "pretrain")["metrics"]["steps"] == 2


def test_a_real_base_extends_its_tokenizer_by_default_and_the_warm_start_slows_or_freezes_the_base_rows(
    trained, english_base, tmp_path
):
    cwd, _ = trained
    for lang in ("nob", "eng"):
        shutil.copytree(cwd / "work" / lang, tmp_path / "work" / lang)
    # with model.base the default tokenizer.extend_base=true holds. A 1 MB sample of nob's 3.6 MB,
    # which the merges are learnt on up to four times here: the stage takes 14 s instead of 31, and
    # all 384 tokens still come
    run_cli(
        "stage=tokenizer",
        "lang=nob",
        f"model.base={english_base}",
        "tokenizer.added_tokens=300",
        "tokenizer.sample_bytes=1000000",
        cwd=tmp_path,
    )
    folder = tmp_path / "work" / "nob" / "tokenizer"
    base, extended = (
        Tokenizer.from_file(str(f / "tokenizer.json")) for f in (english_base, folder)
    )
    assert all(
        extended.token_to_id(token) == token_id for token, token_id in base.get_vocab().items()
    )
    assert (
        json.loads((folder / "special_tokens_map.json").read_text())["eos_token"] == "</s>"
    )  # the base's own
    document = report(tmp_path)
    section = document["tokenizer"]
    # 512 + 300 rounded up to a multiple of 128: 384 asked
    assert (
        section["extended_base"] == str((english_base / "tokenizer.json").resolve())
        and section["base_tokens"] == 512
    )
    assert (
        section["added_tokens_requested"] == 384
        and section["vocab_size"] == 512 + section["added_tokens"] > 800
    )
    assert document["sample"]["bytes"] > 0 and document["new"]["name"] == "base, extended"
    # the added tokens learn from the language alone, though the plan replays English, and those
    # that English uses (this small base's merges are common English pieces) are left out
    assert [s["name"] for s in document["sample"]["sources"]] == ["nob"]
    plan = json.loads((tmp_path / "work" / "nob" / "mix" / "plan.json").read_text())
    assert "eng" in [s["name"] for s in plan["sources"]]
    assert section["left_out"] > 0 and section["spared_bytes"] > 0
    # the base's English tokenizer compared on Norwegian held-out text: fewer tokens per word
    assert document["new"]["scores"]["fertility"] < 0.9 * document["base"]["scores"]["fertility"]
    assert "extended (tokenizer.extend_base=true) by" in (folder / "report.md").read_text()

    run_cli("stage=pack", "lang=nob", f"model.base={english_base}", cwd=tmp_path)

    def warmup(*overrides):
        return run_cli(
            "stage=warmup",
            "lang=nob",
            f"model.base={english_base}",
            "model.num_layers=2",
            "model.max_seq_len=128",
            "warmup.train.steps=1",
            "warmup.train.warmup_steps=0",
            "warmup.train.global_batch_size=8",
            "warmup.train.micro_batch_size=2",
            "warmup.train.eval_tokens=256",
            *overrides,
            cwd=tmp_path,
        )

    warmup("warmup.base_rows=trained", "warmup.base_rows_lr=null")
    metrics = marker(tmp_path / "work", "nob", "warmup")["metrics"]
    rows = metrics["rows"]["embedding"]
    # every base token's row copied, the new ones averaged over the base's pieces
    assert rows["special"] + rows["copied"] == 512 and rows["averaged"] == section["added_tokens"]
    assert metrics["rows"]["base_rows"] == 512

    # warmup.base_rows: `trained`, the base's rows train; `frozen`, they stay as they are and the
    # added ones train. warmup.base_rows_lr: the steps of the base's rows, by default with
    # model.base a tenth of the added rows' (1e-4 against warmup.train.lr 1e-3).
    def embedding(folder):
        return load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"].float()

    base_rows = embedding(english_base)[:512]
    trained_all = embedding(tmp_path / "work" / "nob" / "warmup" / "hf")
    assert not torch.equal(trained_all[:512], base_rows)
    result = warmup()
    assert (
        "the first 512 rows are the base's own and learn from nob, eng at lr 0.0001 "
        "(warmup.base_rows=trained)" in result.stderr
    )
    assert (
        "the vocabulary rows below 512 learn from the sequences of nob, eng, by steps 0.1 times"
        in result.stderr
    )
    # one step from the same start (Adam's first: about 1e-3 an element): the base's rows move a
    # tenth as far, the added ones alike, up to the exported weights' rounding (tests/unit/parallel
    # checks the scaling itself to 1e-7)
    tenth = embedding(tmp_path / "work" / "nob" / "warmup" / "hf")
    ratio = (tenth[:512] - base_rows).norm() / (trained_all[:512] - base_rows).norm()
    assert 0.099 < ratio < 0.101
    torch.testing.assert_close(tenth[512:], trained_all[512:], rtol=0, atol=1e-4)
    result = warmup("warmup.base_rows=frozen")
    assert "the first 512 rows are the base's own and stay as they are" in result.stderr
    kept = embedding(tmp_path / "work" / "nob" / "warmup" / "hf")
    assert torch.equal(kept[:512], base_rows) and not torch.equal(kept[512:], trained_all[512:])

    # evaluate: the warm start's added tokens take a share of the probability on English, which the
    # report gives
    run_cli(
        "stage=evaluate",
        "lang=nob",
        f"model.base={english_base}",
        "eval.max_bytes=20000",
        cwd=tmp_path,
    )
    evaluated = json.loads((tmp_path / "work" / "nob" / "evaluate" / "report.json").read_text())
    added = evaluated["added_tokens"]
    share = added["models"]["warmup"]
    # English's held-out sources are a set each: the embedded sample has UD's English but not the
    # unread novel, which is skipped; the share is measured on the first set scored
    assert [name for name in evaluated["sets"] if name.startswith("base_lang")] == [
        "base_lang:ud_*"
    ]
    assert "holds no text" in evaluated["skipped_sets"]["base_lang:*Adventures-of-Sherlock-Holmes*"]
    assert added["set"] == "base_lang:ud_*" and list(added["models"]) == ["warmup"]
    assert share["first_added"] == 512 and 0 < share["mass"] < 1 and share["base_targets"] > 0


def test_keep_base_takes_a_gpt2_like_bases_one_end_of_text_token_through_pack_and_pretrain(
    trained, tmp_path
):
    cwd, _ = trained
    for lang in ("nob", "eng"):
        shutil.copytree(cwd / "work" / lang, tmp_path / "work" / lang)
    # GPT-2, SmolLM2, Llama 3: one end-of-text token, no pad, no distinct unk
    end = "<|endoftext|>"
    base = Tokenizer(models.BPE())
    base.pre_tokenizer, base.decoder = (
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        decoders.ByteLevel(),
    )
    texts = [r["text"] for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")]
    base.train_from_iterator(
        texts[:200],
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=[end],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    (tmp_path / "gpt2-like").mkdir()
    base.save(str(tmp_path / "gpt2-like" / "tokenizer.json"))
    gpt2 = {"bos_token": end, "eos_token": end, "unk_token": end}
    (tmp_path / "gpt2-like" / "tokenizer_config.json").write_text(
        json.dumps({**gpt2, "model_max_length": 1024})
    )

    run_cli(
        "stage=tokenizer",
        "lang=nob",
        "tokenizer.keep_base=true",
        "tokenizer.base=gpt2-like",
        cwd=tmp_path,
    )
    folder = tmp_path / "work" / "nob" / "tokenizer"
    assert json.loads((folder / "special_tokens_map.json").read_text()) == gpt2
    assert report(tmp_path)["tokenizer"]["roles"] == {"bos": end, "eos": end, "unk": end}
    assert (
        f"special tokens bos `{end}` = 0, eos `{end}` = 0, unk `{end}` = 0."
        in (folder / "report.md").read_text()
    )

    run_cli("stage=pack", "lang=nob", cwd=tmp_path)
    packed = json.loads((tmp_path / "work" / "nob" / "pack" / "packed.json").read_text())
    assert (packed["tokenizer"]["eos"], packed["tokenizer"]["eos_id"]) == (end, 0)
    batch = PackedSampler(
        tmp_path / "work" / "nob" / "pack", seq_len=1024, global_batch_size=4, seed=1
    ).batch(0)
    whole = 0
    for tokens, segments in zip(batch.tokens, batch.segment_ids):
        for segment in range(
            1, segments[-1]
        ):  # the documents that begin and end inside the sequence
            ids = tokens[segments == segment]
            assert ids[-1] == 0 and 0 not in ids[:-1] and base.decode(ids[:-1].tolist()) in texts
            whole += 1
    assert whole > 0

    # training scores its held-out text after the end-of-text token, and the export names it
    run_cli(
        "stage=pretrain",
        "lang=nob",
        "init=scratch",
        "model.num_layers=2",
        "model.max_seq_len=64",
        "train.steps=2",
        "train.warmup_steps=1",
        "train.global_batch_size=2",
        "train.micro_batch_size=2",
        "train.eval_tokens=256",
        cwd=tmp_path,
    )
    assert marker(tmp_path / "work", "nob", "pretrain")["metrics"]["heldout_scored"]["tokens"] > 0
    assert np.load(tmp_path / "work" / "nob" / "pretrain" / "heldout.npz")["inputs"][0, 0] == 0
    exported = json.loads(
        (tmp_path / "work" / "nob" / "pretrain" / "hf" / "config.json").read_text()
    )
    assert (exported["bos_token_id"], exported["eos_token_id"], exported.get("pad_token_id")) == (
        0,
        0,
        None,
    )


def test_a_missing_mix_plan_names_the_command_to_run(trained):
    cwd, _ = trained
    result = run_cli(
        "stage=tokenizer", "lang=rus", "tokenizer.vocab_size=1024", cwd=cwd, check=False
    )  # never mixed
    assert result.returncode == 1
    assert "Stage `tokenizer` for rus needs the output of stage `mix`" in result.stderr
    # the command carries the user's own overrides
    assert "python -m pipeline stage=mix lang=rus tokenizer.vocab_size=1024" in result.stderr
    assert not (cwd / "work" / "rus" / "tokenizer").exists()


def test_empty_training_text_names_the_source_folders(trained, tmp_path):
    cwd, _ = trained
    for lang in ("nob", "eng"):
        shutil.copytree(cwd / "work" / lang, tmp_path / "work" / lang)
    plan = tmp_path / "work" / "nob" / "mix" / "plan.json"
    plan.write_text(
        plan.read_text().replace(str(cwd / "work"), str(tmp_path / "work"))
    )  # the copy's own sources
    train = tmp_path / "work" / "nob" / "clean" / "train"
    for lang in ("nob", "eng"):  # the shards lose their documents after the plan was made
        for shard in (tmp_path / "work" / lang / "clean" / "train").glob("*.jsonl.gz"):
            with gzip.open(shard, "wt"):
                pass
    result = run_cli(
        "stage=tokenizer", "lang=nob", "tokenizer.vocab_size=1024", cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    assert "tokenizer nob: no training text. The mix plan's sources gave nothing:" in result.stderr
    assert f"`nob` ({train}): 0 documents read" in result.stderr
    assert "python -m pipeline stage=clean lang=nob" in result.stderr


def test_a_sample_too_small_for_any_document_fails_naming_the_option(trained):
    cwd, _ = trained
    result = run_cli(
        "stage=tokenizer", "lang=nob", VOCAB, "tokenizer.sample_bytes=10", cwd=cwd, check=False
    )
    assert result.returncode == 1
    assert (
        "no training text" in result.stderr
        and "tokenizer.sample_bytes (10) is large enough" in result.stderr
    )
    assert report(cwd)["tokenizer"]["vocab_size"] == 2048  # the finished output is untouched


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "tokenizer.vocab_size=200",
            "Invalid value for `tokenizer.vocab_size`: 200. Allowed: an integer > 260",
        ),
        (
            "tokenizer.backend=wordpiece",
            "Invalid value for `tokenizer.backend`: 'wordpiece'. Allowed: ",
        ),
        ("tokenizer.sentencepiece_model_type=char", "Allowed: unigram, bpe"),
        ("tokenizer.base=/nonexistent/tokenizer.json", "Invalid value for `tokenizer.base`"),
        (
            "tokenizer.keep_base=true",
            "Invalid value for `tokenizer.keep_base`: True. Allowed: false",
        ),
    ],
    ids=["vocab_size", "backend", "model_type", "base", "keep_base"],
)
def test_bad_options_fail_before_any_work(tmp_path, override, message):
    result = run_cli("stage=tokenizer", "lang=nob", override, cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert message in result.stderr
    assert [p.name for p in (tmp_path / "work" / "nob").iterdir()] == [
        "logs"
    ]  # Hydra's log, nothing else
