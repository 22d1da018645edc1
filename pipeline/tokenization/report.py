"""The tokenizer report as data (`report.json`) and as text (`report.md`, the log)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tokenizers import Tokenizer

from pipeline.corpus.report import bytes_text
from pipeline.tokenization.folder import (
    SENTENCEPIECE_FILE,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TrainedTokenizer,
)
from pipeline.tokenization.metrics import Scores
from pipeline.tokenization.training import SENTENCEPIECE_THREADS
from pipeline.tokenization.sample import SampledSource

# The tokenizer stage's report on its tokenizer, beside the tokenizer's files.
REPORT_FILE, REPORT_TEXT_FILE = "report.json", "report.md"
METRICS = ("fertility", "bytes_per_token", "continued_words", "vocab_used", "roundtrip_rate")
_LABELS = {
    "fertility": "fertility (tokens per word)",
    "bytes_per_token": "bytes per token",
    "continued_words": "continued words (2+ tokens)",
    "vocab_used": "vocabulary used",
    "roundtrip_rate": "exact round trip (documents)",
}
_PERCENT = {"continued_words", "vocab_used", "roundtrip_rate"}
DEFINITIONS = (
    "Words: the language's word tokenizer, punctuation-only words left out; a word's tokens are "
    "those that "
    "overlap it in the encoding of the whole document. Bytes per token: UTF-8 bytes / tokens. "
    "Vocabulary used: "
    "distinct ids seen / vocabulary size. Round trip: decode(encode(x)) == x, special tokens kept."
)


def tokenizer_section(options, trained: TrainedTokenizer) -> dict:
    """What was trained, with which settings (those of the other backend left out)."""
    sentencepiece = options.backend == "sentencepiece"
    return {
        "backend": options.backend,
        "sentencepiece_model_type": options.sentencepiece_model_type if sentencepiece else None,
        "vocab_size": trained.tokenizer.get_vocab_size(),
        "vocab_size_requested": options.vocab_size,
        "special_tokens": {
            token: trained.tokenizer.token_to_id(token)
            for token in options.special_tokens.in_id_order()
        },
        "normalization": options.normalization,
        "pretokenizer_pattern": None if sentencepiece else options.pretokenizer_pattern,
        "max_token_length": options.max_token_length,
        "min_frequency": None if sentencepiece else options.min_frequency,
        "seed": options.seed,
        # SentencePiece's model depends on its thread count (training.py).
        "sentencepiece_threads": SENTENCEPIECE_THREADS if sentencepiece else None,
        "files": [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE]
        + ([SENTENCEPIECE_FILE] if trained.sentencepiece_model is not None else []),
    }


def kept_section(
    base_file: Path,
    tokenizer: Tokenizer,
    roles: dict[str, str],
    folder: Path,
    key: str = "kept_base",
) -> dict:
    """What `tokenizer.keep_base=true` adopted (or, with key `extended_base`, what an extension of
    the base wrote): the base's file, the vocabulary size, the special tokens (with their roles) and
    the files written."""
    return {
        key: str(base_file),
        "vocab_size": tokenizer.get_vocab_size(),
        "special_tokens": {token: tokenizer.token_to_id(token) for token in roles.values()},
        "roles": roles,
        "files": sorted(
            path.name for path in folder.iterdir() if path.suffix in (".json", ".model")
        ),
    }


def extended_section(
    base_file: Path,
    tokenizer: Tokenizer,
    roles: dict[str, str],
    added: dict,
    wanted: int,
    folder: Path,
) -> dict:
    """What `tokenizer.extend_base=true` made: the base's file, what was added (extend_bpe's
    summary, and how many tokens were asked for after rounding the total to a multiple of 128), the
    special tokens and the files."""
    return {
        **kept_section(base_file, tokenizer, roles, folder, key="extended_base"),
        **added,
        "added_tokens_requested": wanted,
    }


def sample_section(sampled: list[SampledSource], sample_bytes: int) -> dict:
    return {
        "sample_bytes": sample_bytes,
        "documents": sum(s.documents for s in sampled),
        "bytes": sum(s.bytes for s in sampled),
        "sources": [
            {
                "name": s.share.name,
                "input": s.input,
                "path": s.path,
                "folder": s.folder,
                "planned_bytes": round(s.share.planned_bytes),
                "unique_bytes": s.share.unique_bytes,
                "cap_bytes": s.share.cap_bytes,
                "keep_probability": s.share.keep_probability,
                "documents_read": s.documents_read,
                "bytes_read": s.bytes_read,
                "documents": s.documents,
                "bytes": s.bytes,
                "bad_records": s.bad_records,
            }
            for s in sampled
        ],
    }


def comparison(new: Optional[Scores], base: Optional[Scores]) -> Optional[dict]:
    """new / base for each metric; below 1 means fewer tokens per word, or fewer bytes per token."""
    if new is None or base is None:
        return None
    new_summary, base_summary = new.summary(), base.summary()
    return {
        key: (
            new_summary[key] / base_summary[key]
            if new_summary[key] is not None and base_summary[key]
            else None
        )
        for key in METRICS
    }


def _cell(key: str, value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2%}" if key in _PERCENT else f"{value:.3f}"


def metrics_table(document: dict) -> str:
    new, base, ratio = document["new"], document["base"], document["new_vs_base"]
    header = f"| metric | new ({new['name']}) |"
    rule = "|---|---:|"
    if base is not None:
        header += f" base ({base['name']}) | new / base |"
        rule += "---:|---:|"
    rows = [header, rule]
    for key in METRICS:
        row = f"| {_LABELS[key]} | {_cell(key, new['scores'][key])} |"
        if base is not None:
            ratio_cell = "n/a" if ratio[key] is None else f"{ratio[key]:.3f}"
            row += f" {_cell(key, base['scores'][key])} | {ratio_cell} |"
        rows.append(row)
    return "\n".join(rows)


def markdown(document: dict) -> str:
    """The report as text: what the tokenizer is, what it was trained on, its scores on the held-out
    text, the training sample's sources and the notes."""
    sample = document["sample"]
    lines = [f"# Tokenizer for {document['lang']}", "", _tokenizer_paragraph(document), ""]
    if sample is not None:
        lines += [_sample_paragraph(sample), ""]
    lines += _heldout_lines(document)
    if sample is not None:
        lines += _sample_table(sample)
    if document["notes"]:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in document["notes"]]
    return "\n".join(lines) + "\n"


def _tokenizer_paragraph(document: dict) -> str:
    """What the tokenizer is: the base's kept (no sample), the base's extended, or one trained."""
    tok = document["tokenizer"]
    roles = ", ".join(
        f"{role} `{token}` = {tok['special_tokens'][token]}"
        for role, token in tok.get("roles", {}).items()
    )
    if document["sample"] is None:
        return (
            f"The base model's tokenizer, kept (tokenizer.keep_base=true): {tok['kept_base']}, "
            f"{tok['vocab_size']:,} tokens; special tokens {roles}. Nothing was trained."
        )
    if tok.get("extended_base"):
        return (
            f"The base model's tokenizer {tok['extended_base']} ({tok['base_tokens']:,} tokens), "
            "extended "
            f"(tokenizer.extend_base=true) by {tok['added_tokens']:,} tokens (asked: "
            f"{tok['added_tokens_requested']:,}; {tok['merges']:,} merges learnt on the sample as "
            "the base cuts "
            f"it, {tok['existing']:,} of them building a token the base had; {tok['left_out']:,} "
            "learnt tokens "
            f"left out, as {bytes_text(tok['spared_bytes'])} of the plan's other sources use them, "
            f"tokenizer.spare_ratio): {tok['vocab_size']:,} tokens; the base's tokens keep their "
            "ids; special "
            f"tokens {roles}."
        )
    backend = tok["backend"] + (
        f" ({tok['sentencepiece_model_type']})" if tok["backend"] == "sentencepiece" else ""
    )
    specials = ", ".join(
        f"`{token}` = {token_id}" for token, token_id in tok["special_tokens"].items()
    )
    return (
        f"{backend}, {tok['vocab_size']:,} tokens (asked: {tok['vocab_size_requested']:,}); "
        "special tokens "
        f"{specials}; normalization {tok['normalization']}."
    )


def _sample_paragraph(sample: dict) -> str:
    return (
        f"Trained on {bytes_text(sample['bytes'])} of text ({sample['documents']:,} documents) "
        "sampled "
        f"from the mix plan (tokenizer.sample_bytes = {bytes_text(sample['sample_bytes'])})."
    )


def _heldout_lines(document: dict) -> list[str]:
    """The held-out text, the metrics table and their definitions; or why nothing was evaluated."""
    heldout = document["heldout"]
    if not heldout["documents"]:
        return [
            f"No held-out text in {heldout['folder']}: nothing to evaluate; {heldout['advice']}"
        ]
    return [
        f"Evaluated on {heldout['documents']:,} held-out documents "
        f"({bytes_text(heldout['bytes'])}, "
        f"{heldout['words']:,} words; word tokenizer {heldout['word_tokenizer']}) from "
        f"{heldout['folder']}"
        + (" (up to tokenizer.eval_bytes)." if heldout["truncated"] else "."),
        "",
        metrics_table(document),
        "",
        DEFINITIONS,
    ]


def _sample_table(sample: dict) -> list[str]:
    """A row per source of the training sample: what the plan asked of it and what was taken."""
    return [
        "",
        "## Training sample",
        "",
        "| source | input | planned bytes | keep probability | documents | bytes |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {s['name']} | {s['input']} | {bytes_text(s['planned_bytes'])} | "
            f"{s['keep_probability']:.3g} | "
            f"{s['documents']:,} | {s['bytes']:,} |"
            for s in sample["sources"]
        ),
    ]
