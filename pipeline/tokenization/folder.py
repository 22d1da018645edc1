"""The tokenizer on disk, as `tokenizers`, `transformers` and `sentencepiece` load it, and the base tokenizer.

`tokenizer.json` is the tokenizer (`tokenizers.Tokenizer.from_file`,
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)`); `tokenizer_config.json` and
`special_tokens_map.json` make the folder an offline `transformers.AutoTokenizer.from_pretrained`
folder; `tokenizer.model` is the SentencePiece model it was converted from, when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from tokenizers import Tokenizer

from pipeline.tokenization.training import TrainedTokenizer

TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"


def write_tokenizer_folder(folder: Path, trained: TrainedTokenizer, special_tokens) -> None:
    trained.tokenizer.save(str(folder / TOKENIZER_FILE))
    if trained.sentencepiece_model is not None:
        (folder / SENTENCEPIECE_FILE).write_bytes(trained.sentencepiece_model)
    names = {"bos_token": special_tokens.bos, "eos_token": special_tokens.eos, "pad_token": special_tokens.pad,
             "unk_token": special_tokens.unk}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        # The pack stage places the document boundaries itself; encoding adds nothing.
        "add_bos_token": False,
        "add_eos_token": False,
        # transformers' clean-up would change spaces around punctuation and break the exact round trip.
        "clean_up_tokenization_spaces": False,
    }
    for name, content in (("tokenizer_config.json", config), ("special_tokens_map.json", names)):
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def special_token_strings(folder: Path, roles=("bos", "eos", "pad", "unk")) -> dict[str, str]:
    """The special tokens (`bos` -> "<s>" ...) that a folder's special_tokens_map.json or tokenizer_config.json names."""
    found = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if not (folder / name).is_file():
            continue
        content = json.loads((folder / name).read_text(encoding="utf-8"))
        for role in roles:
            token = content.get(f"{role}_token")
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                found.setdefault(role, token)
    return found


def base_tokenizer_file(path: str) -> Optional[Path]:
    """The tokenizer.json that `tokenizer.base` names (the file, or one in the folder); None if there is none."""
    candidate = Path(path)
    if candidate.is_dir():
        candidate = candidate / TOKENIZER_FILE
    return candidate if candidate.is_file() else None


def load_base_tokenizer(path: str) -> Tokenizer:
    # A local file only: no hub download, no remote code.
    return Tokenizer.from_file(str(base_tokenizer_file(path)))
