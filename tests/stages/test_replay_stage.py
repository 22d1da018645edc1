"""stage=replay: the base model's own samples of its language, which the default mix replays;
through the CLI on the small English base of tests/english_base_model.py."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer

from pipeline.mixing.mix_config import ReplayConfig
from pipeline.mixing.replay import SOURCE, _load_base, write_samples
from tests.conftest import copy_of, marker, read_jsonl_gz, run_cli

SAMPLES = ("replay.tokens=3000", "replay.length=48")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, nob_eng_cleaned, english_base):
    cwd = copy_of(nob_eng_cleaned, tmp_path_factory, "replay")
    result = run_cli("stage=replay", "lang=eng", f"model.base={english_base}", *SAMPLES, cwd=cwd)
    return cwd, result


def test_the_base_writes_documents_of_its_own_tokens(replayed, english_base):
    cwd, result = replayed
    metrics = marker(cwd / "work", "eng", "replay")["metrics"]
    records = read_jsonl_gz(cwd / "work" / "eng" / "replay" / "train")
    assert metrics["tokens"] >= 3000 and metrics["documents"] == len(records) > 0
    assert (
        metrics["batch_size"] == 16 and metrics["device"] == "cpu"
    )  # a CPU's batch; the base is small
    assert sum(r["metadata"]["tokens"] for r in records) == metrics["tokens"]
    assert all(r["metadata"]["source"] == SOURCE and r["text"].strip() for r in records)
    assert all(0 < r["metadata"]["tokens"] <= 48 for r in records)
    # Sampled, not repeated: the documents differ, and the base's tokenizer reads them back about as
    # long.
    assert len({r["text"] for r in records}) == len(records)
    tokenizer = Tokenizer.from_file(str(english_base / "tokenizer.json"))
    lengths = [len(tokenizer.encode(r["text"], add_special_tokens=False).ids) for r in records]
    assert abs(sum(lengths) - metrics["tokens"]) < 0.1 * metrics["tokens"]
    assert "replay: sampling 3,000 tokens" in result.stderr

    again = run_cli("stage=replay", "lang=eng", f"model.base={english_base}", *SAMPLES, cwd=cwd)
    assert "Skipping replay for eng" in again.stderr


def test_the_default_mix_replays_the_samples_beside_the_clean_text(replayed):
    cwd, _ = replayed
    run_cli("stage=mix", "lang=nob", cwd=cwd)
    plan = json.loads((cwd / "work" / "nob" / "mix" / "plan.json").read_text(encoding="utf-8"))
    sources = {s["name"]: s for s in plan["sources"]}
    samples = sources["eng-samples"]
    assert (
        samples["input"] == "clean output"
        and samples["kind"] == "fixed ratio"
        and samples["tokens"] > 0
    )
    assert sources["eng"]["tokens"] > 0 and sources["nob"]["epochs"] == 4
    records = read_jsonl_gz(cwd / "work" / "eng" / "replay" / "train")
    assert samples["unique_bytes"] == sum(len(r["text"].encode("utf-8")) for r in records)


def test_an_interrupted_replay_keeps_its_shards_and_samples_the_same_rest(english_base, tmp_path):
    settings = ReplayConfig(tokens=600, length=32, batch_size=4, seed=3)
    first = write_samples(str(english_base), tmp_path / "a", settings, "cpu")
    shards = sorted((tmp_path / "a").iterdir())
    assert first["shards"] == len(shards) > 2
    kept = shards[0].stat().st_mtime_ns
    for shard in shards[1:]:
        shard.unlink()
    again = write_samples(str(english_base), tmp_path / "a", settings, "cpu")
    assert again == {**first, "empty_samples": again["empty_samples"]}
    assert shards[0].stat().st_mtime_ns == kept
    # The same seeds give the same text, shard by shard, also spread over two processes (as over a
    # node's GPUs).
    spread = write_samples(str(english_base), tmp_path / "b", settings, "cpu", workers=2)
    assert spread == {**first, "devices": 2, "empty_samples": spread["empty_samples"]}
    assert read_jsonl_gz(tmp_path / "a") == read_jsonl_gz(tmp_path / "b")


def test_samples_are_decoded_without_the_bases_clean_up_of_spaces(english_base, tmp_path):
    # SmolLM2's tokenizer_config.json asks for transformers' clean-up ("Hello , world" -> "Hello,
    # world"), which transformers before 5 applies when decoding: the samples would not be the text
    # the base wrote.
    base = tmp_path / "base"
    shutil.copytree(english_base, base)
    config_file = base / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.exists() else {}
    config_file.write_text(
        json.dumps({**config, "clean_up_tokenization_spaces": True}), encoding="utf-8"
    )
    _, tokenizer, _ = _load_base(str(base), "cpu")
    assert tokenizer.clean_up_tokenization_spaces is False
    text = "Hello , world . Isn 't it ?"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_stage_all_samples_the_base_before_the_mix(tmp_path_factory, nob_eng_cleaned, english_base):
    cwd = copy_of(nob_eng_cleaned, tmp_path_factory, "replay-all")
    # A mix source that does not exist stops the chain at the mix, after what it replays has been
    # made.
    missing = (
        "mix.sources=[{name:eng,path:${work_dir}/eng/clean,ratio:0.25},"
        "{name:eng-samples,path:${work_dir}/eng/replay,ratio:0.2},{name:gone,path:/nonexistent/corpus}]"
    )
    result = run_cli(
        "stage=all",
        "lang=nob",
        "workers=2",
        f"model.base={english_base}",
        *SAMPLES,
        missing,
        cwd=cwd,
        check=False,
    )
    assert result.returncode != 0 and "mix source `gone`" in result.stderr
    assert marker(cwd / "work", "eng", "replay")["metrics"]["tokens"] >= 3000
    assert result.stderr.index("Running replay for eng") < result.stderr.index(
        "Skipping clean for nob"
    )


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("lang=nob", "model.base={base}"), "run it with lang=eng"),
        (("lang=eng",), "set model.base="),
        (("lang=eng", "model.base={base}", "replay.tokens=0"), "replay.tokens is 0"),
    ],
)
def test_replay_refuses_what_it_cannot_do(overrides, says, english_base, tmp_path):
    result = run_cli(
        "stage=replay", *(o.format(base=english_base) for o in overrides), cwd=tmp_path, check=False
    )
    assert result.returncode != 0 and says in result.stderr
