"""The pack stage through the real CLI, on the embedded Norwegian sample cleaned, mixed and
tokenized by the real stages."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

from pipeline.packing.sampler import PackedSampler
from tests.conftest import DATA, marker, read_jsonl_gz, run_cli

VOCAB = "tokenizer.vocab_size=1024"
# Deduplication finds nothing to remove in the embedded sample and takes most of clean's time.
FAST_CLEAN = "clean.dedup.enabled=false"
CHAIN = ("clean", "mix", "tokenizer", "pack")


def run_chain(cwd, *overrides: str, first: str = "clean"):
    """The stages up to pack, one command each (`stage=all` would also run the stages after pack);
    pack's result."""
    for stage in CHAIN[CHAIN.index(first) :]:
        result = run_cli(
            f"stage={stage}", "lang=nob", VOCAB, FAST_CLEAN, "workers=2", *overrides, cwd=cwd
        )
    return result


def packed_json(cwd) -> dict:
    return json.loads((cwd / "work" / "nob" / "pack" / "packed.json").read_text(encoding="utf-8"))


def plan_json(cwd) -> dict:
    return json.loads((cwd / "work" / "nob" / "mix" / "plan.json").read_text(encoding="utf-8"))


def shard_files(cwd, source: str = "nob") -> list:
    return sorted((cwd / "work" / "nob" / "pack" / "shards" / source).iterdir())


def packed_size(cwd, source: str = "nob") -> int:
    return sum(path.stat().st_size for path in shard_files(cwd, source))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("pack_stage")
    return cwd, run_chain(cwd)


def test_acceptance_the_shards_hold_every_training_document_tokenized_with_eos(packed):
    cwd, result = packed
    tokenizer = Tokenizer.from_file(str(cwd / "work" / "nob" / "tokenizer" / "tokenizer.json"))
    texts = [r["text"] for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")]
    expected = np.concatenate(
        [tokenizer.encode(text, add_special_tokens=False).ids + [1] for text in texts]
    )
    stored = np.concatenate(
        [np.fromfile(path, dtype="<u2") for path in shard_files(cwd) if path.suffix == ".ds"]
    )
    np.testing.assert_array_equal(stored, expected)

    document, plan = packed_json(cwd), plan_json(cwd)
    nob, estimate = document["sources"][0], plan["sources"][0]
    assert document["tokenizer"]["dtype"] == "uint16" and document["tokenizer"]["eos_id"] == 1
    assert (
        nob["documents"] == len(texts)
        and nob["unique_tokens"] == len(expected) == document["unique_tokens"]
    )
    # the estimates are kept beside the exact numbers; without mix.tokens the budget is the target x
    # 4 again
    assert nob["unique_tokens_est"] == estimate["unique_tokens_est"] != nob["unique_tokens"]
    assert (
        document["budget_tokens_est"] == plan["budget_tokens"] == 4 * estimate["unique_tokens_est"]
    )
    assert nob["epochs"] == 4 and document["budget_tokens"] == nob["tokens"] == 4 * len(expected)
    assert nob["repeats"] == {"min": 4, "max": 4} and nob["pass_tokens"] == 4 * len(expected)
    metrics = marker(cwd / "work", "nob", "pack")["metrics"]
    assert metrics["unique_tokens"] == {"nob": len(expected)} and metrics["epochs"] == {"nob": 4.0}
    assert metrics["unique_tokens_est"] == {"nob": estimate["unique_tokens_est"]} and metrics[
        "share"
    ] == {"nob": 1.0}
    assert "| nob | 1,5" in result.stderr and "unique tokens (est -> exact)" in result.stderr


def test_the_sampler_reads_whole_training_documents_from_the_pack(packed):
    cwd, _ = packed
    tokenizer = Tokenizer.from_file(str(cwd / "work" / "nob" / "tokenizer" / "tokenizer.json"))
    texts = {r["text"] for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")}
    batch = PackedSampler(
        cwd / "work" / "nob" / "pack", seq_len=2048, global_batch_size=16, seed=1
    ).batch(2)
    whole = 0
    for tokens, segments in zip(batch.tokens, batch.segment_ids):
        for segment in range(
            1, segments[-1]
        ):  # the documents that begin and end inside the sequence
            ids = tokens[segments == segment]
            assert (
                ids[-1] == 1
                and tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False) in texts
            )
            whole += 1
    assert whole > 0


def test_acceptance_packed_size_is_the_unique_tokens_whatever_the_epochs(packed, tmp_path):
    cwd, _ = packed
    four = packed_json(cwd)
    unique_bytes = four["unique_tokens"] * 2
    assert four["sources"][0]["epochs"] == 4 and 1 <= packed_size(cwd) / unique_bytes <= 1.05
    assert four["packed_bytes"] == packed_size(cwd)

    shutil.copytree(cwd / "work", tmp_path / "work")
    result = run_chain(tmp_path, "mix.max_epochs=1", first="mix")
    assert "Running pack for nob" in result.stderr
    one = packed_json(tmp_path)
    assert (
        one["sources"][0]["epochs"] == 1
        and one["pass_tokens"] == one["unique_tokens"] == four["unique_tokens"]
    )
    assert 1 <= packed_size(tmp_path) / unique_bytes <= 1.05
    # four epochs cost no more than one: the same token files (the metadata names the tokenizer's
    # path)
    assert [p.read_bytes() for p in shard_files(tmp_path) if p.suffix in (".ds", ".index")] == [
        p.read_bytes() for p in shard_files(cwd) if p.suffix in (".ds", ".index")
    ]


def test_a_filler_source_gets_its_exact_epochs_and_its_share_of_every_batch(packed, tmp_path):
    cwd, _ = packed
    shutil.copytree(cwd / "work", tmp_path / "work")
    estimate = plan_json(cwd)["sources"][0]["unique_tokens_est"]
    budget = 10 * estimate  # more than nob (4 epochs) and Nynorsk (4 epochs) give
    # with rehydration on; clean ran without deduplication, so every document counts as a cluster of
    # one
    run_chain(
        tmp_path,
        f"mix.tokens={budget}",
        f"mix.sources=[{{name:nno,path:{DATA / 'nno'},priority:1}}]",
        "mix.rehydration.enabled=true",
        first="mix",
    )
    document = packed_json(tmp_path)
    nob, nno = document["sources"]
    assert nno["name"] == "nno" and nno["input"] == "raw folder" and nno["exact"]
    assert nob["epochs"] == nno["epochs"] == 4 and nob["tokens"] == 4 * nob["unique_tokens"]
    assert document["budget_tokens"] == budget
    assert (
        document["shortfall_tokens"]
        == budget - 4 * (nob["unique_tokens"] + nno["unique_tokens"])
        > 0
    )
    assert nno["share"] == pytest.approx(4 * nno["unique_tokens"] / budget)
    assert nno["share_est"] == plan_json(tmp_path)["sources"][1]["share"] != nno["share"]
    assert (
        document["rehydration"]
        and nob["rehydration"]["scale"] == pytest.approx(4.0)
        and "rehydration" not in nno
    )
    assert nob["rehydration"]["buckets"][0]["tokens"] == nob["unique_tokens"] and nob[
        "repeats"
    ] == {"min": 4, "max": 4}

    sampler = PackedSampler(
        tmp_path / "work" / "nob" / "pack", seq_len=512, global_batch_size=16, seed=1
    )
    steps = 20
    consumed = sampler.consumed(steps)
    assert sum(consumed.values()) == steps * 16
    assert consumed["nno"] == pytest.approx(
        steps * 16 * nno["pass_tokens"] / document["pass_tokens"], abs=1
    )


def stage_outputs(work, stages: tuple[str, ...]) -> dict:
    """Every file the stages wrote, byte for byte, and their markers' hashes and metrics."""
    found = {}
    for stage in stages:
        for path in sorted((work / "nob" / stage).rglob("*")):
            if path.is_file() and path.name != "_SUCCESS.json":
                found[str(path.relative_to(work))] = path.read_bytes()
        done = marker(work, "nob", stage)
        found[f"{stage} marker"] = (done["config_hash"], done["metrics"])
    return found


def test_the_tokenizer_and_pack_are_the_same_on_one_worker_as_on_three(packed, tmp_path):
    cwd, _ = packed
    stages = ("tokenizer", "pack")
    shutil.copytree(cwd / "work", tmp_path / "work")
    runs = []
    for workers in (1, 3):  # in the same folder: pack records the tokenizer's path
        for stage in stages:
            shutil.rmtree(tmp_path / "work" / "nob" / stage)
        for stage in stages:
            run_cli(
                f"stage={stage}", "lang=nob", VOCAB, FAST_CLEAN, f"workers={workers}", cwd=tmp_path
            )
        runs.append(stage_outputs(tmp_path / "work", stages))
    assert any(name.endswith(".ds") for name in runs[0]) and "nob/tokenizer/report.json" in runs[0]
    assert runs[0] == runs[1]
    # `workers` is not part of the config hash: the fixture's run (workers=2) has the same
    assert runs[0]["pack marker"][0] == marker(cwd / "work", "nob", "pack")["config_hash"]


def test_the_same_command_is_skipped(packed):
    cwd, _ = packed
    before = marker(cwd / "work", "nob", "pack")
    result = run_cli("stage=pack", "lang=nob", cwd=cwd)
    assert "Skipping pack for nob: it is up to date" in result.stderr
    assert marker(cwd / "work", "nob", "pack") == before


@pytest.mark.parametrize(
    "override, message",
    [
        ("pack.batch_size=0", "Invalid value for `pack.batch_size`: 0. Allowed: a positive number"),
        ("pack.seed=-1", "Invalid value for `pack.seed`: -1"),
    ],
    ids=["batch_size", "seed"],
)
def test_bad_pack_options_fail_before_any_work(tmp_path, override, message):
    result = run_cli("stage=pack", "lang=nob", override, cwd=tmp_path, check=False)
    assert result.returncode == 1 and message in result.stderr
    assert [p.name for p in (tmp_path / "work" / "nob").iterdir()] == ["logs"]
