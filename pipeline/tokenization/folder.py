"""The tokenizer on disk, as `tokenizers`, `transformers` and `sentencepiece` load it, and the base
tokenizer.

`tokenizer.json` is the tokenizer (`tokenizers.Tokenizer.from_file`,
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)`); `tokenizer_config.json` and
`special_tokens_map.json` make the folder an offline `transformers.AutoTokenizer.from_pretrained`
folder; `tokenizer.model` is the SentencePiece model it was converted from, when there is one.

What a tokenizer trainer gives back, and how it fails.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tokenizers import Tokenizer

from pipeline.errors import StageError

TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE = "tokenizer_config.json", "special_tokens_map.json"
ROLES = ("bos", "eos", "pad", "unk")


def write_tokenizer_folder(folder: Path, trained: TrainedTokenizer, special_tokens) -> None:
    trained.tokenizer.save(str(folder / TOKENIZER_FILE))
    if trained.sentencepiece_model is not None:
        (folder / SENTENCEPIECE_FILE).write_bytes(trained.sentencepiece_model)
    write_transformers_files(folder, {role: getattr(special_tokens, role) for role in ROLES})


def base_tokenizer_roles(base: str) -> tuple[Tokenizer, dict[str, str]]:
    """The base's tokenizer and its own special tokens by role (`special_tokens_by_role`). A base
    without an end-of-text token is refused (ValueError): the pack stage ends every document with
    it."""
    source = base_tokenizer_file(base)
    tokenizer = load_tokenizer(source)
    roles = special_tokens_by_role(source.parent, tokenizer)
    if "eos" not in roles:
        raise ValueError(_no_end_of_text(source.parent, tokenizer))
    return tokenizer, roles


def adopt_base_tokenizer(folder: Path, base: str) -> tuple[Tokenizer, dict[str, str]]:
    """Put the base tokenizer in `folder` as the trained one would be: its tokenizer.json byte for
    byte (and the base folder's tokenizer.model), with the transformers files naming the base's own
    special tokens. Returns the tokenizer and those tokens by role (base_tokenizer_roles, which says
    what is refused)."""
    tokenizer, roles = base_tokenizer_roles(base)
    shutil.copyfile(base_tokenizer_file(base), folder / TOKENIZER_FILE)
    if Path(base).is_dir() and (Path(base) / SENTENCEPIECE_FILE).is_file():
        shutil.copyfile(Path(base) / SENTENCEPIECE_FILE, folder / SENTENCEPIECE_FILE)
    write_transformers_files(folder, roles)
    return tokenizer, roles


def special_tokens_by_role(folder: Path, tokenizer: Tokenizer) -> dict[str, str]:
    """The special tokens of a tokenizer (or model) folder by role (`eos` -> "<|endoftext|>" ...),
    in ROLES order: as the folder's special_tokens_map.json or tokenizer_config.json names them,
    else by id in its config.json; only tokens `tokenizer` holds. A role may be missing, and roles
    may share a token (GPT-2: bos = eos = unk)."""
    named = special_token_strings(folder)
    ids = _config_token_ids(folder)
    roles = {}
    for role in ROLES:
        if role in named and tokenizer.token_to_id(named[role]) is not None:
            roles[role] = named[role]
        elif role in ids and tokenizer.id_to_token(ids[role]) is not None:
            roles[role] = tokenizer.id_to_token(ids[role])
    return roles


def _config_token_ids(folder: Path) -> dict[str, int]:
    """bos/eos/pad/unk ids that a model folder's config.json gives (an int; not a list of several)."""
    config = folder / "config.json"
    if not config.is_file():
        return {}
    hf = json.loads(config.read_text(encoding="utf-8"))
    return {
        role: hf[f"{role}_token_id"]
        for role in ROLES
        if isinstance(hf.get(f"{role}_token_id"), int)
    }


def _no_end_of_text(folder: Path, tokenizer: Tokenizer) -> str:
    specials = sorted(tokenizer.id_to_token(token_id) for token_id in special_ids(tokenizer))
    candidates = (
        f"its special tokens are {', '.join(specials[:8])}{' ...' if len(specials) > 8 else ''}"
        if specials
        else "its tokenizer.json marks no token as special"
    )
    return (
        f"{folder} names no end-of-text token that its {TOKENIZER_FILE} holds (an `eos_token` of "
        "tokenizer_config.json or special_tokens_map.json, or an `eos_token_id` of config.json). "
        "The pack stage "
        'ends every document with it: add "eos_token": "<the token>" to '
        f"{folder / TOKENIZER_CONFIG_FILE} "
        f"({candidates})."
    )


def write_transformers_files(folder: Path, roles: dict[str, str]) -> None:
    """tokenizer_config.json and special_tokens_map.json, naming the special tokens by role (`eos`
    -> "</s>")."""
    names = {f"{role}_token": token for role, token in roles.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        # The pack stage places the document boundaries itself; encoding adds nothing.
        "add_bos_token": False,
        "add_eos_token": False,
        # transformers' clean-up would change spaces around punctuation and break the exact round
        # trip.
        "clean_up_tokenization_spaces": False,
    }
    for name, content in ((TOKENIZER_CONFIG_FILE, config), (SPECIAL_TOKENS_FILE, names)):
        (folder / name).write_text(
            json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def special_token_strings(folder: Path, roles=ROLES) -> dict[str, str]:
    """The special tokens (`bos` -> "<s>" ...) that a folder's special_tokens_map.json or
    tokenizer_config.json names."""
    found = {}
    for name in (SPECIAL_TOKENS_FILE, TOKENIZER_CONFIG_FILE):
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
    """The tokenizer.json that `tokenizer.base` names (the file, or one in the folder); None if
    there is none."""
    candidate = Path(path)
    if candidate.is_dir():
        candidate = candidate / TOKENIZER_FILE
    return candidate if candidate.is_file() else None


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer.json of a model or tokenizer folder (or the file itself): a local file only, no
    hub download, no remote code."""
    file = base_tokenizer_file(str(path))
    if file is None:
        raise StageError(
            f"{path} has no {TOKENIZER_FILE}. Save the model's own tokenizer there (e.g. "
            f"AutoTokenizer.from_pretrained(...).save_pretrained(folder)) and run again."
        )
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
        raise StageError(
            f"{file} is not a readable tokenizer file ({error}): it is damaged or cut short."
        ) from None
    # Whole documents, each encoded alone, wherever the pipeline encodes (pack, the tokenizer's
    # report, evaluate): a base's tokenizer.json may carry its model's input limits.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def tokenizer_digest(file: Path) -> str:
    """The SHA-256 of a tokenizer.json: the pack stage records it, and the training stages check
    that they load the tokenizer the data was packed with."""
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def special_ids(tokenizer: Tokenizer) -> set[int]:
    return {
        token_id
        for token_id, added in tokenizer.get_added_tokens_decoder().items()
        if added.special
    }


def token_roles(folder: Path, tokenizer: Tokenizer) -> dict[str, Optional[int]]:
    """bos/eos/pad/unk ids from the tokenizer files, else from config.json (None where neither names
    one); pad falls back to eos."""
    named = special_tokens_by_role(folder, tokenizer)
    roles = {role: tokenizer.token_to_id(named[role]) if role in named else None for role in ROLES}
    if roles["pad"] is None:
        roles["pad"] = roles["eos"]
    return roles


class TrainingError(RuntimeError):
    """The trainer could not build the vocabulary from this text; the message says why."""


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    # The SentencePiece model (`tokenizer.model`) the tokenizer was converted from; None for
    # byte-level BPE.
    sentencepiece_model: Optional[bytes] = None
