"""Documents sampled from the base model in its own language, for the mix's replay.

Replaying the base's own language keeps it only as far as the replayed text is like what the base
was trained on: the project's English is 7.4M characters of novels, which a model repeats until it
has learnt them rather than kept English (docs/benchmark-log.md, "The base's tokenizer extended").
Text the base writes itself, sampled from its end-of-text token at temperature 1 (without the least
likely tokens, `replay.top_p`), is its own kind of text in any quantity; training on it pulls the
model back towards the base's predictions on what the base knows.

The samples are written as a clean stage output (`train/` shards of JSONL in datatrove's layout),
one shard per batch of documents, drawn from its own seed (`replay.seed` + the shard's number): an
interrupted stage keeps its finished shards and samples only the rest, and the same settings and
batch size give the same text, on one device or several.

Speed: a small base is limited by launches and memory traffic, not arithmetic. So the documents
are sampled in large batches with a static KV cache (transformers' default cache grows by
concatenation, copying the whole cache at every token: 1.9x slower at 3,072 documents on an H200,
docs/benchmark-log.md), and the shards are spread over every visible GPU, one process each (on a
CPU, over `workers` processes), whose bases load while this process loads its own and stay loaded
from one round of shards to the next.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


from pipeline.errors import StageError
from pipeline.mixing.mix_config import ReplayConfig
from pipeline.progress import Progress

log = logging.getLogger(__name__)

SOURCE = "base-model-samples"
SHARD = "samples-{:05d}.jsonl.gz"
CPU_BATCH = 16


def _base_config(base: str):
    """The base's config as transformers reads it (never with remote code): its shape, before any
    weights load."""
    import transformers

    if not (Path(base) / "config.json").is_file():
        raise StageError(
            "replay samples text from a Hugging Face folder (config.json, weights, tokenizer "
            "files); "
            f"model.base={base} has no config.json. Export the model with transformers' "
            f"save_pretrained, or set replay.tokens=0 to go without samples."
        )
    return transformers.AutoConfig.from_pretrained(base, trust_remote_code=False)


def _load_base(base: str, device: str):
    """The base and its tokenizer as transformers loads them (never with remote code), and its
    end-of-text id."""
    import torch
    import transformers

    # Decoded exactly: a base's tokenizer_config.json may ask for transformers' clean-up of spaces
    # around punctuation (SmolLM2's does), which older transformers apply and which would write text
    # the base did not sample.
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        base, trust_remote_code=False, clean_up_tokenization_spaces=False
    )
    if tokenizer.eos_token_id is None:
        raise StageError(
            f"replay: the tokenizer of model.base={base} names no end-of-text token, which the "
            "samples "
            f"begin after and end at: set eos_token in its tokenizer_config.json."
        )
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=dtype, trust_remote_code=False
    )
    return model.to(device).eval(), tokenizer, tokenizer.eos_token_id


# The share of replay.length that a sample fills on average, as the batch size plans it: most of a
# base's samples run to the length (SmolLM2-135M's 1,022 tokens of 1,024), and a round of shards that
# falls short of the tokens costs a second round as long as the first.
PLANNED_FILL = 0.9


def batch_size(config, replay: ReplayConfig, device: str, devices: int = 1) -> int:
    """`replay.batch_size`, or as many documents as half the GPU's free memory holds with their bf16
    KV cache and float32 logits (16 on a CPU), but no more than each device's share of the
    documents that the tokens ask for (at PLANNED_FILL of the length): every device gets work, and
    one shard each usually reaches the tokens. `config`: the base's (transformers')."""
    import torch

    needed = math.ceil(replay.tokens / (replay.length * PLANNED_FILL))
    if replay.batch_size is not None:
        return min(replay.batch_size, needed)
    share = -(-needed // devices)
    if not device.startswith("cuda"):
        return min(CPU_BATCH, share)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_document = (
        2 * config.num_hidden_layers * kv_heads * head_dim * 2 * (replay.length + 1)
        + 4 * 4 * config.vocab_size
    )
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(1, min(free // 2 // per_document, share))


def _sample_batch(
    model, end_of_text: int, replay: ReplayConfig, documents: int, seed: int
) -> list[list[int]]:
    """`documents` samples, each begun after the end-of-text token and cut at the next one."""
    import torch
    import transformers

    torch.manual_seed(seed)
    device = next(model.parameters()).device
    prompt = torch.full((documents, 1), end_of_text, dtype=torch.long, device=device)
    # A generation config of its own: the base folder's (repetition penalties, top-k ...) would
    # change the distribution that the samples stand for. The static cache is allocated once
    # (the default one is copied at every token); not compiled, as a compile costs more than it
    # saves on a few batches and would stall each new batch size.
    static = getattr(model, "_can_compile_fullgraph", False)
    settings = transformers.GenerationConfig(
        do_sample=True,
        temperature=replay.temperature,
        top_p=replay.top_p,
        top_k=0,
        max_new_tokens=replay.length,
        eos_token_id=end_of_text,
        pad_token_id=end_of_text,
        **({"cache_implementation": "static", "disable_compile": True} if static else {}),
    )
    with torch.inference_mode():
        rows = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_config=settings
        )
    return [
        row[: row.index(end_of_text)] if end_of_text in row else row for row in rows[:, 1:].tolist()
    ]


def _counts(shard: Path) -> tuple[int, int]:
    """Tokens and documents in a finished shard."""
    with gzip.open(shard, "rt", encoding="utf-8") as handle:
        tokens = [json.loads(line)["metadata"]["tokens"] for line in handle]
    return sum(tokens), len(tokens)


def _write_shard(path: Path, documents: list[dict]) -> None:
    partial = path.with_name(path.name + ".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps(document, ensure_ascii=False) + "\n")
    os.replace(partial, path)


def _sample_shard(
    loaded, replay: ReplayConfig, batch: int, folder: Path, shard: int
) -> tuple[int, int]:
    """Samples shard `shard` into `folder`; returns its tokens and how many samples were empty
    (dropped)."""
    model, tokenizer, end_of_text = loaded
    sampled = _sample_batch(model, end_of_text, replay, batch, replay.seed + shard)
    texts = tokenizer.batch_decode(sampled, skip_special_tokens=True)
    kept = [(text, len(ids)) for text, ids in zip(texts, sampled) if text.strip()]
    _write_shard(
        folder / SHARD.format(shard),
        [
            {
                "text": text,
                "id": f"{SOURCE}/{shard}/{i}",
                "metadata": {"source": SOURCE, "tokens": length},
            }
            for i, (text, length) in enumerate(kept)
        ],
    )
    return sum(length for _, length in kept), len(sampled) - len(kept)


# In a helper process (one per device): the base it has loaded, so that a second round of shards
# does not load it again.
_HELPER_BASE: dict = {}


def _sample_on(
    base: str, device: str, replay: ReplayConfig, batch: int, folder: Path, shards: list[int]
) -> tuple[int, int]:
    """A helper process's shards, on its own device (its own copy of the base): their tokens and
    empty samples."""
    import torch

    if (base, device) not in _HELPER_BASE:
        if device == "cpu":  # the processes share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
        else:
            torch.cuda.set_device(device)
        _HELPER_BASE[base, device] = _load_base(base, device)
    loaded = _HELPER_BASE[base, device]
    counts = [_sample_shard(loaded, replay, batch, folder, shard) for shard in shards]
    return sum(tokens for tokens, _ in counts), sum(empty for _, empty in counts)


def _devices(device: str, workers: int) -> list[str]:
    """Where shards are sampled at once: every visible GPU, or `workers` processes on a CPU."""
    import torch

    if device == "cuda":
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return ["cpu"] * workers


class _Sampler:
    """Shards spread over `devices`: this process samples the first device's share, one spawned
    helper process each the other devices' (each keeps its base loaded for the next round). A
    round's helpers are started before this process loads its own base, so that the loads
    overlap."""

    def __init__(self, base: str, devices: list[str], replay: ReplayConfig, batch: int) -> None:
        self.base, self.devices, self.replay, self.batch = base, devices, replay, batch
        self.loaded = None
        # One single-process pool per helper device, so that a helper's every round runs on the
        # device whose base it keeps (a shared pool hands any job to any idle process).
        self.pools = []
        if len(devices) > 1:
            import torch.multiprocessing

            spawn = torch.multiprocessing.get_context("spawn")
            self.pools = [ProcessPoolExecutor(1, mp_context=spawn) for _ in devices[1:]]

    def __enter__(self) -> "_Sampler":
        return self

    def __exit__(self, *error) -> None:
        for pool in self.pools:
            pool.shutdown(cancel_futures=True)
        # stage=all goes on in this process: the training ranks need the memory the KV caches held.
        self.loaded = None
        if self.devices[0].startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def round(self, folder: Path, shards: list[int], progress: Progress) -> int:
        """Samples `shards` into `folder`; returns the empty samples dropped."""
        shares = [shards[index :: len(self.devices)] for index in range(len(self.devices))]
        futures = [
            pool.submit(_sample_on, self.base, device, self.replay, self.batch, folder, share)
            for pool, device, share in zip(self.pools, self.devices[1:], shares[1:])
            if share
        ]
        if self.loaded is None:
            self.loaded = _load_base(self.base, self.devices[0])
        empty = 0
        for shard in shares[0]:
            tokens, dropped = _sample_shard(self.loaded, self.replay, self.batch, folder, shard)
            progress.update(tokens)
            empty += dropped
        for future in futures:
            tokens, dropped = future.result()
            progress.update(tokens)
            empty += dropped
        return empty


def write_samples(
    base: str, folder: Path, replay: ReplayConfig, device: str, workers: int = 1
) -> dict:
    """Sample `replay.tokens` tokens of documents from `base` into `folder` (shards already there
    are kept); returns the counts for the marker."""
    folder.mkdir(parents=True, exist_ok=True)
    devices = _devices(device, workers)
    batch = batch_size(_base_config(base), replay, devices[0], len(devices))
    log.info(
        "replay: sampling %s tokens from %s on %d %s device(s), %d documents of up to %d tokens "
        "at a time on each",
        f"{replay.tokens:,}",
        base,
        len(devices),
        device.upper(),
        batch,
        replay.length,
    )
    tokens, documents, empty, shard, sampled = 0, 0, 0, 0, set()
    with (
        Progress("replay samples", replay.tokens, "tokens", log) as progress,
        _Sampler(base, devices, replay, batch) as sampler,
    ):
        while tokens < replay.tokens:
            path = folder / SHARD.format(shard)
            if not path.exists():
                # As many missing shards as the tokens still wanted need, were every document
                # full-length: never one more than the sequential order would write.
                wanted = math.ceil((replay.tokens - tokens) / (batch * replay.length))
                missing = [
                    index
                    for index in range(shard, shard + wanted)
                    if not (folder / SHARD.format(index)).exists()
                ]
                empty += sampler.round(folder, missing, progress)
                sampled.update(missing)
            found, in_shard = _counts(path)
            if shard not in sampled:  # written by an interrupted run of the same settings
                progress.update(found)
            if in_shard == 0:
                raise StageError(
                    f"replay: every sample of model.base={base} in {path.name} was empty (it ended "
                    "each one at once): check that the folder's tokenizer names the token its "
                    "documents end with as eos_token."
                )
            tokens, documents, shard = tokens + found, documents + in_shard, shard + 1
    log.info(
        "replay: %s tokens in %d documents sampled from %s (%d empty ones dropped)",
        f"{tokens:,}",
        documents,
        base,
        empty,
    )
    return {
        "tokens": tokens,
        "documents": documents,
        "shards": shard,
        "batch_size": batch,
        "devices": len(devices),
        "empty_samples": empty,
        "device": device,
    }
