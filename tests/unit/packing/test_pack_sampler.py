"""Packed data and its sampler on small synthetic sources whose every document is recognisable by
its tokens.

Each document is one word repeated (a word-level tokenizer gives it its own id), so the sampler's
output says which document every token came from. The shards are written by the stage's own code
(pipeline/packing/tokenize.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from pipeline.corpus.sources import raw_folder
from pipeline.mixing.rehydration import weight_for
from pipeline.packing.output import source_folder, tokenizer_entry, write_packed, write_source
from pipeline.packing.packed import rehydrated_epochs
from pipeline.packing.sampler import PackedSampler, SamplerStateError
from pipeline.packing.sampler import Blend
from pipeline.packing.shards import PackedDataError
from pipeline.packing.tokenize import Encoder, tokenize_source
from pipeline.progress import Progress
from tests.conftest import REPO, write_jsonl_gz

EOS = 1
FIRST_WORD = 4  # after <s>, </s>, <pad>, <unk>
FINEWEB2 = [(1, 1.0), (2, 2.0), (3, 3.0), (5, 5.0), (100, 8.0)]
# Source `a`: 2.5 epochs for every document. Source `b`: rehydrated, 1.5 epochs on average over its
# tokens.
A_EPOCHS, B_MEAN_EPOCHS = 2.5, 1.5
SEQ_LEN, BATCH = 32, 4


def word(i: int) -> str:
    return f"w{i}"


def write_word_tokenizer(path, words: int) -> None:
    vocab = {
        "<s>": 0,
        "</s>": 1,
        "<pad>": 2,
        "<unk>": 3,
        **{word(i): i for i in range(FIRST_WORD, FIRST_WORD + words)},
    }
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(path))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Pack folder with sources `a` (60 documents in two files) and `b` (40, with duplicate-cluster
    sizes)."""
    root = tmp_path_factory.mktemp("pack")
    rng = np.random.default_rng(0)
    documents = {"a": 60, "b": 40}
    write_word_tokenizer(root / "tokenizer.json", sum(documents.values()))
    lengths, ids, first = {}, {}, FIRST_WORD
    for name, count in documents.items():
        ids[name] = np.arange(first, first + count)
        first += count
        lengths[name] = rng.integers(
            1, 120, size=count
        )  # words; the document has one token more, its EOS
        records = [
            {"id": f"{name}{i}", "text": " ".join([word(ids[name][i])] * int(lengths[name][i]))}
            for i in range(count)
        ]
        files = 2 if name == "a" else 1
        for part in range(files):
            write_jsonl_gz(root / "raw" / name / f"{part}.jsonl.gz", records[part::files])
        # the reader reads the files in order: documents 0, 2, 4 ... then 1, 3, 5 ...
        order = np.concatenate([np.arange(part, count, files) for part in range(files)])
        ids[name], lengths[name] = ids[name][order], lengths[name][order]

    out = root / "out"
    encoder = Encoder(
        Tokenizer.from_file(str(root / "tokenizer.json")), root / "tokenizer.json", EOS, 16
    )
    quiet = Progress("pack", None, "B", logging.getLogger(__name__))
    tokenized = {
        name: tokenize_source(
            raw_folder(name, root / "raw" / name),
            source_folder(out, name),
            encoder,
            root / "scratch" / name,
            quiet,
        )
        for name in documents
    }
    cluster_sizes = rng.choice([1, 1, 1, 2, 3, 7, 150], size=documents["b"])
    b_epochs, _ = rehydrated_epochs(
        cluster_sizes, tokenized["b"].document_tokens, FINEWEB2, B_MEAN_EPOCHS
    )
    epochs = {"a": np.full(documents["a"], A_EPOCHS), "b": b_epochs}
    entries = [write_source(out, tokenized[name], epochs[name], seed=3) for name in documents]
    write_packed(
        out,
        tokenizer_entry(root / "tokenizer.json", FIRST_WORD + sum(documents.values()), "</s>", EOS),
        entries,
    )
    return {
        "dir": out,
        "ids": ids,
        "lengths": lengths,
        "epochs": epochs,
        "cluster_sizes": cluster_sizes,
        "tokenized": tokenized,
    }


def sampler(folder, seed: int = 7, **kwargs) -> PackedSampler:
    return PackedSampler(folder, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=seed, **kwargs)


def source_streams(s: PackedSampler, steps: int) -> list[np.ndarray]:
    """Each source's token stream, put together again from the windows that the global batches hold."""
    windows: list[dict] = [{} for _ in s.names]
    for step in range(steps):
        batch = s.batch(step)
        for row in range(len(batch)):
            windows[batch.source[row]][int(batch.window[row])] = batch.tokens[row]
    streams = []
    for taken in windows:
        assert sorted(taken) == list(
            range(len(taken))
        )  # each source's windows in order, none skipped
        for j in range(len(taken) - 1):
            assert (
                taken[j][-1] == taken[j + 1][0]
            )  # consecutive windows overlap by exactly one token
        streams.append(np.concatenate([taken[j][:-1] for j in range(len(taken))]))
    return streams


def test_tokenizing_keeps_every_document_whole_with_its_eos(packed):
    for name, tokenized in packed["tokenized"].items():
        assert [s.file for s in tokenized.shards] == [
            f"{i:05d}_unshuffled.ds" for i in range(len(tokenized.shards))
        ]
        np.testing.assert_array_equal(tokenized.document_tokens, packed["lengths"][name] + 1)
        tokens = np.concatenate(
            [
                np.fromfile(source_folder(packed["dir"], name) / s.file, dtype="<u2")
                for s in tokenized.shards
            ]
        )
        expected = np.concatenate(
            [[i] * n + [EOS] for i, n in zip(packed["ids"][name], packed["lengths"][name])]
        )
        np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("seed", [7, 8])
def test_acceptance_one_pass_reads_every_document_as_often_as_its_epochs_say(packed, seed):
    s = sampler(packed["dir"], seed=seed)
    plan = json.loads((packed["dir"] / "packed.json").read_text())
    pass_tokens = [source["pass_tokens"] for source in plan["sources"]]
    steps = math.ceil(sum(pass_tokens) / (SEQ_LEN * BATCH)) + 2
    streams = source_streams(s, steps)
    for name, stream, tokens in zip(s.names, streams, pass_tokens):
        first_pass = stream[:tokens]
        assert (
            len(first_pass) == tokens and first_pass[-1] == EOS
        )  # a pass ends with a whole document
        pieces = np.split(first_pass, np.flatnonzero(first_pass == EOS) + 1)[:-1]
        length = dict(zip(packed["ids"][name], packed["lengths"][name]))
        reads = dict.fromkeys(packed["ids"][name], 0)
        for piece in pieces:  # each read is the whole document, then its EOS
            assert len(set(piece[:-1])) == 1 and len(piece) == length[piece[0]] + 1
            reads[piece[0]] += 1
        epochs = packed["epochs"][name]
        got = np.array([reads[i] for i in packed["ids"][name]])
        assert np.all((got == np.floor(epochs)) | (got == np.ceil(epochs))), name
        # the extra reads of the fractional epochs add up to their share of the tokens, within one
        # document
        document_tokens = packed["lengths"][name] + 1
        extra = np.dot(got - np.floor(epochs), document_tokens)
        assert (
            abs(extra - np.dot(epochs - np.floor(epochs), document_tokens)) <= document_tokens.max()
        )
    # rehydration: more duplicated documents are read more often, in the table's proportions
    b = packed["epochs"]["b"]
    sizes = packed["cluster_sizes"]
    assert b[sizes == 150].mean() / b[sizes == 1].mean() == pytest.approx(
        weight_for(150, FINEWEB2) / 1.0
    )
    tokens_b = packed["lengths"]["b"] + 1
    assert np.dot(b, tokens_b) / tokens_b.sum() == pytest.approx(B_MEAN_EPOCHS)
    # the sources are drawn in proportion to their tokens, batch after batch
    consumed = s.consumed(steps // 2)
    share = pass_tokens[0] / sum(pass_tokens)
    assert abs(consumed["a"] - share * (steps // 2) * BATCH) <= 2


def test_the_order_is_seeded_and_each_pass_is_shuffled_anew(packed):
    first, again, other = (
        sampler(packed["dir"]),
        sampler(packed["dir"]),
        sampler(packed["dir"], seed=8),
    )
    np.testing.assert_array_equal(first.batch(5).tokens, again.batch(5).tokens)
    assert not np.array_equal(first.batch(5).tokens, other.batch(5).tokens)
    steps_per_pass = first.pass_tokens // (SEQ_LEN * BATCH)
    assert first.passes(steps_per_pass) <= 1 < first.passes(steps_per_pass + 1)
    # the second pass of a source reads the same documents as the first, in another order
    stream = first.streams[0]
    passes = np.empty((2, stream.pass_tokens), np.int64)
    for i in range(2):
        stream.read(
            i * stream.pass_tokens,
            stream.pass_tokens,
            passes[i],
            np.empty(stream.pass_tokens, bool),
        )
    assert not np.array_equal(passes[0], passes[1])
    np.testing.assert_array_equal(np.sort(passes[0]), np.sort(passes[1]))


def test_segment_ids_start_a_new_document_after_each_eos(packed):
    batch = sampler(packed["dir"]).batch(3)
    assert (
        batch.tokens.shape == batch.segment_ids.shape == (BATCH, SEQ_LEN + 1)
        and batch.tokens.dtype == np.int64
    )
    np.testing.assert_array_equal(np.diff(batch.segment_ids, axis=1), batch.tokens[:, :-1] == EOS)
    assert np.all(batch.segment_ids[:, 0] == 0)
    for row in range(BATCH):
        cu = batch.cu_seqlens(row)
        assert cu[0] == 0 and cu[-1] == SEQ_LEN + 1 and len(cu) == batch.segment_ids[row, -1] + 2
        for start, end in zip(cu[:-1], cu[1:]):
            assert len(set(batch.segment_ids[row, start:end])) == 1


RESUME = """
import json, sys
import numpy as np
from pipeline.packing.sampler import PackedSampler
folder, state_file, world, rank, steps, out = sys.argv[1:]
s = PackedSampler(folder, seq_len={seq_len}, global_batch_size={batch}, seed=7, rank=int(rank), world=int(world))
s.load_state_dict(json.loads(open(state_file).read()))
batches = [next(iter(s)) for _ in range(int(steps))]
np.save(out, np.stack([b.tokens for b in batches]))
open(out + ".json", "w").write(json.dumps(s.state_dict()))
""".format(seq_len=SEQ_LEN, batch=BATCH)


def resume_in_new_process(folder, state_file, world: int, rank: int, steps: int, out) -> np.ndarray:
    subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME,
            str(folder),
            str(state_file),
            str(world),
            str(rank),
            str(steps),
            str(out),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    return np.load(out)


def test_acceptance_a_saved_state_resumes_the_identical_stream_in_a_new_process(packed, tmp_path):
    k, more = 11, 6
    uninterrupted = sampler(packed["dir"])
    expected = [uninterrupted.batch(step).tokens for step in range(k + more)]

    interrupted = sampler(packed["dir"])
    stream = iter(interrupted)
    for step in range(k):
        np.testing.assert_array_equal(next(stream).tokens, expected[step])
    state = interrupted.state_dict()
    assert state["step"] == k and sum(state["consumed"].values()) == k * BATCH
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))  # a checkpoint stores it as JSON

    resumed = resume_in_new_process(packed["dir"], state_file, 1, 0, more, tmp_path / "dp1.npy")
    np.testing.assert_array_equal(resumed, np.stack(expected[k:]))
    # saved with DP=1, restored with DP=2: each rank takes its half, and together they are the
    # global batch
    halves = [
        resume_in_new_process(
            packed["dir"], state_file, 2, rank, more, tmp_path / f"dp2_{rank}.npy"
        )
        for rank in range(2)
    ]
    assert halves[0].shape == (more, BATCH // 2, SEQ_LEN + 1)
    np.testing.assert_array_equal(halves[1][0], uninterrupted.batch(k).rank_slice(1, 2).tokens)
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), np.stack(expected[k:]))
    final = json.loads((tmp_path / "dp2_1.npy.json").read_text())
    assert final["step"] == k + more and final["consumed"] == uninterrupted.consumed(k + more)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(seed=8), "seed: saved 7, now 8"),
        (dict(global_batch_size=8), "global_batch_size: saved 4, now 8"),
        (dict(seq_len=16), "seq_len: saved 32, now 16"),
    ],
    ids=["seed", "batch", "seq_len"],
)
def test_a_state_from_another_stream_is_refused_naming_the_difference(packed, change, message):
    saved = sampler(packed["dir"])
    saved.step = 3
    options = dict(seq_len=SEQ_LEN, global_batch_size=BATCH, seed=7) | change
    with pytest.raises(SamplerStateError, match=message):
        PackedSampler(packed["dir"], **options).load_state_dict(saved.state_dict())


def test_a_state_over_other_packed_data_is_refused(packed, tmp_path):
    state = sampler(packed["dir"]).state_dict()
    copy = shutil.copytree(packed["dir"], tmp_path / "pack")
    document = json.loads((copy / "packed.json").read_text())
    document["seed"] = 4  # packed again with another pack.seed: other documents get the extra reads
    (copy / "packed.json").write_text(json.dumps(document))
    with pytest.raises(SamplerStateError, match="packed: saved"):
        sampler(copy).load_state_dict(state)


def test_blend_matches_a_full_sort_of_every_sequence_by_its_due_time():
    tokens = [5000, 1234, 77, 1234]
    blend = Blend(tokens)
    counts = [2000 * t // sum(tokens) + 5 for t in tokens]
    due = sorted(
        (((2 * j + 1) / (2 * t)), s, j)
        for s, (t, n) in enumerate(zip(tokens, counts))
        for j in range(n)
    )
    # complete up to the first time at which some source has no more generated sequences
    complete_until = min((2 * n - 1) / (2 * t) for t, n in zip(tokens, counts))
    due = [d for d in due if d[0] <= complete_until]
    assert len(due) >= 1800
    for start in (0, 1, 5, 99, 1000, 1500):
        consumed, sources, windows = blend.take(start, 300)
        window = due[start : start + 300]
        assert consumed == [
            sum(1 for _, s, _ in due[:start] if s == source) for source in range(len(tokens))
        ]
        assert list(sources) == [s for _, s, _ in window] and list(windows) == [
            j for _, _, j in window
        ]


def _truncate_by_one_token(shard):
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 2)


def _cut_half_a_token(shard):
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)


def _scramble_index(shard):
    index = np.fromfile(f"{shard}.index", dtype="<u8")
    index[[1, 2]] = index[[2, 1]]
    index.tofile(f"{shard}.index")


def _shift_a_document_end(shard):
    # One token moves from a document to the next one, read as often: the index still increases,
    # still ends at the last token and gives the same tokens per pass. Only reading the documents
    # finds it.
    repeats = np.load(shard.parent / "repeats.npy")
    index = np.fromfile(f"{shard}.index", dtype="<u8")
    document = next(i for i in range(len(index) - 1) if repeats[i] == repeats[i + 1])
    index[document] += 1
    index.tofile(f"{shard}.index")


def _drop_index(shard):
    (shard.parent / f"{shard.name}.index").unlink()


def _overwrite_tokens(shard):
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[tokens != EOS] = (
        60000  # the right size and the EOS in place, but ids this vocabulary does not have
    )
    tokens.tofile(shard)


@pytest.mark.parametrize(
    "damage, message",
    [
        (_truncate_by_one_token, "holds .* tokens, but packed.json recorded"),
        (_cut_half_a_token, "not a whole number of 2-byte tokens"),
        (_scramble_index, "index is not strictly increasing"),
        (_drop_index, r"\.index is missing"),
        (_shift_a_document_end, "does not end with EOS"),
        (_overwrite_tokens, "outside the vocabulary"),
    ],
    ids=["truncated", "half-token", "index-order", "no-index", "index-shifted", "garbage-tokens"],
)
def test_acceptance_a_broken_shard_fails_naming_the_file_and_the_fix(
    packed, tmp_path, damage, message
):
    copy = shutil.copytree(packed["dir"], tmp_path / "pack")
    shard = source_folder(copy, "a") / "00000_unshuffled.ds"
    damage(shard)
    with pytest.raises(PackedDataError, match=message) as error:
        s = sampler(copy)
        for step in range(s.pass_tokens // (SEQ_LEN * BATCH) + 2):  # a pass reads every document
            s.batch(step)
    assert "00000_unshuffled.ds" in str(error.value)
    assert "python -m pipeline stage=pack" in str(error.value) and "_SUCCESS.json" in str(
        error.value
    )


def test_repeats_that_do_not_fit_the_shards_fail(packed, tmp_path):
    copy = shutil.copytree(packed["dir"], tmp_path / "pack")
    np.save(source_folder(copy, "b") / "repeats.npy", np.ones(3, dtype="<u2"))
    with pytest.raises(PackedDataError, match="repeats.npy holds"):
        sampler(copy)
