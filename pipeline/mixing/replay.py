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
batch size give the same text.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

from tqdm import tqdm

from pipeline.errors import StageError
from pipeline.mixing.mix_config import ReplayConfig

log = logging.getLogger(__name__)

SOURCE = "base-model-samples"
SHARD = "samples-{:05d}.jsonl.gz"
CPU_BATCH = 16


def _load_base(base: str, device: str):
    """The base and its tokenizer as transformers loads them (never with remote code), and its
    end-of-text id."""
    import torch
    import transformers

    if not (Path(base) / "config.json").is_file():
        raise StageError(
            "replay samples text from a Hugging Face folder (config.json, weights, tokenizer "
            "files); "
            f"model.base={base} has no config.json. Export the model with transformers' "
            f"save_pretrained, or set replay.tokens=0 to go without samples."
        )
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
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=dtype, trust_remote_code=False
    )
    return model.to(device).eval(), tokenizer, tokenizer.eos_token_id


def batch_size(model, replay: ReplayConfig) -> int:
    """`replay.batch_size`, or as many documents as half the GPU's free memory holds with their KV
    cache and float32 logits (16 on a CPU); never more than the tokens asked for need."""
    import torch

    needed = -(-replay.tokens // replay.length)
    if replay.batch_size is not None:
        return min(replay.batch_size, needed)
    device = next(model.parameters()).device
    if device.type != "cuda":
        return min(CPU_BATCH, needed)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(model.parameters()).element_size()
    per_document = (
        2 * config.num_hidden_layers * kv_heads * head_dim * element * (replay.length + 1)
        + 4 * 4 * config.vocab_size
    )
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(free // 2 // per_document, needed))


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
    # change the distribution that the samples stand for.
    settings = transformers.GenerationConfig(
        do_sample=True,
        temperature=replay.temperature,
        top_p=replay.top_p,
        top_k=0,
        max_new_tokens=replay.length,
        eos_token_id=end_of_text,
        pad_token_id=end_of_text,
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


def write_samples(base: str, folder: Path, replay: ReplayConfig, device: str) -> dict:
    """Sample `replay.tokens` tokens of documents from `base` into `folder` (shards already there
    are kept); returns the counts for the marker."""
    folder.mkdir(parents=True, exist_ok=True)
    model, tokenizer, end_of_text = _load_base(base, device)
    batch = batch_size(model, replay)
    log.info(
        "replay: sampling %s tokens from %s on the %s, %d documents of up to %d tokens at a time",
        f"{replay.tokens:,}",
        base,
        device.upper(),
        batch,
        replay.length,
    )
    tokens, documents, empty, shard = 0, 0, 0, 0
    with tqdm(
        total=replay.tokens, unit="tok", unit_scale=True, desc="replay samples", disable=None
    ) as bar:
        while tokens < replay.tokens:
            path = folder / SHARD.format(shard)
            if path.exists():  # written by an interrupted run of the same settings
                found, in_shard = _counts(path)
            else:
                sampled = _sample_batch(model, end_of_text, replay, batch, replay.seed + shard)
                texts = tokenizer.batch_decode(sampled, skip_special_tokens=True)
                kept = [(text, len(ids)) for text, ids in zip(texts, sampled) if text.strip()]
                empty += len(sampled) - len(kept)
                _write_shard(
                    path,
                    [
                        {
                            "text": text,
                            "id": f"{SOURCE}/{shard}/{i}",
                            "metadata": {"source": SOURCE, "tokens": length},
                        }
                        for i, (text, length) in enumerate(kept)
                    ],
                )
                found, in_shard = sum(length for _, length in kept), len(kept)
            if in_shard == 0:
                raise StageError(
                    f"replay: every sample of model.base={base} in {path.name} was empty (it ended "
                    "each "
                    "one at once): check that the folder's tokenizer names the token its "
                    "documents end "
                    f"with as eos_token."
                )
            tokens, documents, shard = tokens + found, documents + in_shard, shard + 1
            bar.update(found)
            log.info(
                "replay: shard %d done, %s of %s tokens", shard, f"{tokens:,}", f"{replay.tokens:,}"
            )
    # stage=all goes on in this process: the training ranks need the memory the KV caches held.
    del model
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
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
        "empty_samples": empty,
        "device": device,
    }
