"""A small English base model for the warm-start tests: its own byte-level BPE tokenizer and a tiny
transformer trained for 300 steps (one to two minutes on one core; built once per test session) on
the embedded English text, saved as a Hugging Face folder (what a user's `model.base` is)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.config import REPO_ROOT
from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_export import to_hf
from pipeline.model.transformer import Transformer
from pipeline.tokenization.tokenizer_config import SpecialTokens, TokenizerConfig
from pipeline.tokenization.folder import write_tokenizer_folder
from pipeline.tokenization.training import train_tokenizer

# The `tiny` preset's body with fewer layers, so the base trains in seconds.
BASE_SHAPE = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=384)


def english_texts() -> list[str]:
    texts = []
    for path in sorted((REPO_ROOT / "data" / "eng").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            texts.extend(json.loads(line)["text"] for line in handle)
    return texts


def build_english_base(folder: Path, steps: int = 300, seq_len: int = 128, batch: int = 8) -> Path:
    texts = english_texts()
    trained = train_tokenizer(texts, TokenizerConfig(vocab_size=512))
    tokenizer = trained.tokenizer
    eos = tokenizer.token_to_id("</s>")
    stream = [i for ids in tokenizer.encode_batch(texts) for i in ids.ids + [eos]]
    data = torch.tensor(stream, dtype=torch.long)
    cfg = ModelConfig(**BASE_SHAPE, vocab_size=tokenizer.get_vocab_size(), max_seq_len=seq_len)
    torch.manual_seed(0)
    model = Transformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
        window = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tokenizer_dir = folder.parent / f"{folder.name}-tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    write_tokenizer_folder(tokenizer_dir, trained, SpecialTokens())
    to_hf(model, folder, tokenizer=tokenizer_dir)
    return folder
