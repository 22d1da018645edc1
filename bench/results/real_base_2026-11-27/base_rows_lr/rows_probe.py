"""Probe (issue 27): does training SmolLM2's (tied) embedding rows on the novels, body frozen, at a small learning
rate, make it better on a novel it never read? Base tokenizer only (no added tokens).
usage: python3 rows_probe.py HF_FOLDER GUTENBERG_JSONL_GZ"""
import gzip
import json
import math
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, data = sys.argv[1], sys.argv[2]
import os
dev = torch.device(os.environ.get("PROBE_DEV", "cuda"))
STEPS = int(os.environ.get("PROBE_STEPS", "122"))
LIMIT = int(os.environ.get("PROBE_LIMIT", "100000"))
tok = AutoTokenizer.from_pretrained(folder)
eos = tok.convert_tokens_to_ids("<|endoftext|>")
train_docs, pages, book = [], [], []
with gzip.open(data, "rt") as f:
    for i, line in enumerate(f):
        d = json.loads(line)
        if i >= LIMIT and i % 97 and not d["id"].endswith("1661/part000"):
            continue
        if "Sherlock" in d["source"]:
            book.append(d["text"])
        elif i % 20 == 7:
            pages.append(d["text"])
        else:
            train_docs.append(d["text"])
ids = []
for t in train_docs:
    ids += [eos] + tok(t)["input_ids"]
train = torch.tensor(ids, dtype=torch.long)
print(f"train tokens {len(train):,}, pages {len(pages)}, book parts {len(book)}", flush=True)


@torch.no_grad()
def score(model, texts, window=2048, stride=1024, batch=8):
    nats, nbytes = 0.0, 0
    for t in texts:
        x = [eos] + tok(t)["input_ids"]
        nbytes += len(t.encode())
        starts = list(range(0, max(1, len(x) - 1), stride))
        rows = []
        for s in starts:
            seq = x[s:s + window + 1]
            first = 0 if s == 0 else window - stride  # score only tokens not scored by the previous window
            rows.append((seq, first))
            if s + window + 1 >= len(x):
                break
        for b in range(0, len(rows), batch):
            chunk = rows[b:b + batch]
            L = max(len(r[0]) for r in chunk)
            inp = torch.full((len(chunk), L), eos, dtype=torch.long)
            w = torch.zeros((len(chunk), L - 1))
            for j, (seq, first) in enumerate(chunk):
                inp[j, :len(seq)] = torch.tensor(seq)
                w[j, first:len(seq) - 1] = 1
            inp, w = inp.to(dev), w.to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = model(inp[:, :-1]).logits.float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), inp[:, 1:], reduction="none")
            nats += float((nll * w).sum())
    return nats / math.log(2) / nbytes


def fresh():
    m = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(dev)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


base = fresh().eval()
b_book, b_pages = score(base, book), score(base, pages)
print(f"base book {b_book:.4f} pages {b_pages:.4f}", flush=True)
del base
g = torch.Generator().manual_seed(0)
for batch in [int(b) for b in os.environ.get("PROBE_BATCHES", "4,16").split(",")]:
    for lr in [float(x) for x in os.environ.get("PROBE_LRS", "1e-3,3e-4,1e-4,3e-5,1e-5").split(",")]:
        t0 = time.time()
        m = fresh()
        emb = m.get_input_embeddings().weight
        emb.requires_grad_(True)
        opt = torch.optim.AdamW([emb], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        m.train()
        for step in range(STEPS):
            starts = torch.randint(0, len(train) - 2049, (batch,), generator=g)
            x = torch.stack([train[s:s + 2049] for s in starts]).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = m(x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        m.eval()
        s_book, s_pages = score(m, book), score(m, pages)
        print(f"batch {batch} lr {lr:g}: book {s_book:.4f} ({s_book / b_book - 1:+.2%}) pages {s_pages:.4f} "
              f"({s_pages / b_pages - 1:+.2%}) last loss {loss.item():.3f} [{time.time() - t0:.0f}s]", flush=True)
        del m, opt
