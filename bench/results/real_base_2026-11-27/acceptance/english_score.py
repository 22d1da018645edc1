"""Score models on English held-out text with the evaluate stage's own functions (same windows and scoring).
usage: python3 score.py MODEL_FOLDER[,...] ; prints bits per byte on the eng held-out source (whole book) and split."""
import sys
from pathlib import Path
import torch
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.evaluation.bits_per_byte import score_documents
from pipeline.model.files import load_base
from pipeline.model.config import ModelConfig  # noqa
from pipeline.tokenization.folder import load_tokenizer, token_roles

device = torch.device("cuda")
sets = {}
for split in ("heldout_source", "heldout"):
    docs = read_documents(clean_output("eng", Path("/tmp/acc/w/eng/clean"), split=split), Path(f"/tmp/acc/scr_{split}"))
    sets[split] = [d.text for d in docs]
for folder in sys.argv[1].split(","):
    model = load_base(folder).to(device).eval().to(torch.bfloat16)
    tok = load_tokenizer(folder)
    start = token_roles(Path(folder), tok)["eos"]
    for split, texts in sets.items():
        s = score_documents(model, tok, texts, start, 2048, 1024, 8, device)
        print(folder, split, round(s.bits_per_byte, 4), s.tokens, s.bytes, flush=True)
