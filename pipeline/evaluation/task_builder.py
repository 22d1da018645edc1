"""Two downstream tasks built from held-out documents of the language, so that the demo and the
tests measure more than bits per byte with nothing downloaded. The evaluate stage builds them from
the clean stage's held-out split (`eval.heldout_tasks`); they are written in the layouts of
`eval.tasks` and read back like any user's task.

- `source` (sib200 layout): which source a paragraph comes from. A paragraph is a line of at least
  40 characters (cut at a word boundary after 300); its source is the first word of its raw file's
  name (`lovdata` for lovdata_lovtidend_2025.jsonl.gz, `npk`, `ud`). Sources with at least 20
  paragraphs take part, as many of each (at most 100), split 50/10/40% into train, dev and test.
- `continuation` (continuation layout: belebele's fields, each answer scored as the passage's
  continuation): a passage of 24 words of a document and four answers of 6 words: the words that
  follow it, and three spans of other documents. The question is empty. Up to 8 items per document,
  200 in all; it needs 4 documents at least.

Both are drawn with a fixed seed: the same documents give the same tasks.
"""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path
from typing import Iterable

from pipeline.evaluation.eval_config import CONTINUATION, TaskConfig

SOURCE_TASK, CONTINUATION_TASK = "source", "continuation"
MIN_PARAGRAPH_CHARS, MAX_PARAGRAPH_CHARS = 40, 300
MIN_PER_SOURCE, MAX_PER_SOURCE = 20, 100
SPLIT_SHARES = (("train", 0.5), ("dev", 0.1), ("test", 0.4))
PASSAGE_WORDS, ANSWER_WORDS = 24, 6
ITEMS_PER_DOCUMENT, MAX_ITEMS, MIN_DOCUMENTS = 8, 200, 4
SEED = 0


def source_label(metadata: dict) -> str:
    """The first word of the document's raw file name, lower case; `unknown` without one."""
    name = Path(str(metadata.get("raw_file") or "unknown")).name
    return re.split(r"[^0-9A-Za-z]+", name)[0].lower() or "unknown"


def paragraphs(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        line = " ".join(line.split())  # no tabs or runs of spaces in a TSV field
        if len(line) < MIN_PARAGRAPH_CHARS:
            continue
        if len(line) > MAX_PARAGRAPH_CHARS:
            line = line[:MAX_PARAGRAPH_CHARS].rsplit(" ", 1)[0]
        found.append(line)
    return found


def build_source_task(documents: list[tuple[str, dict]], folder: Path) -> str | None:
    """Writes the `source` task into `folder` (train.tsv, dev.tsv, test.tsv); returns None, or why
    it cannot."""
    by_source: dict[str, list[str]] = {}
    for text, metadata in documents:
        by_source.setdefault(source_label(metadata), []).extend(paragraphs(text))
    by_source = {source: sorted(set(found)) for source, found in by_source.items()}
    kept = {source: found for source, found in by_source.items() if len(found) >= MIN_PER_SOURCE}
    if len(kept) < 2:
        counts = (
            ", ".join(f"{source}: {len(found)}" for source, found in sorted(by_source.items()))
            or "none"
        )
        return (
            f"it needs two sources with {MIN_PER_SOURCE} paragraphs of {MIN_PARAGRAPH_CHARS}+ "
            "characters each "
            f"in the held-out text (paragraphs per source: {counts})"
        )
    each = min(MAX_PER_SOURCE, *(len(found) for found in kept.values()))
    rows = {split: [] for split, _ in SPLIT_SHARES}
    generator = random.Random(SEED)
    for source, found in sorted(kept.items()):
        chosen = generator.sample(found, each)
        start = 0
        for number, (split, share) in enumerate(SPLIT_SHARES):
            end = each if number == len(SPLIT_SHARES) - 1 else start + round(share * each)
            rows[split] += [(source, text) for text in chosen[start:end]]
            start = end
    folder.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        generator.shuffle(items)
        with open(folder / f"{split}.tsv", "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
            writer.writerow(["index_id", "category", "text"])
            writer.writerows((index, source, text) for index, (source, text) in enumerate(items))
    return None


def build_continuation_task(texts: list[str], file: Path) -> str | None:
    """Writes the `continuation` task to `file` (JSONL); returns None, or why it cannot."""
    span = PASSAGE_WORDS + ANSWER_WORDS
    documents = [words for words in (text.split() for text in texts) if len(words) >= span]
    if len(documents) < MIN_DOCUMENTS:
        return f"it needs {MIN_DOCUMENTS} held-out documents of {span}+ words, and there are {len(documents)}"
    generator = random.Random(SEED)
    starts = [
        (number, start)
        for number, words in enumerate(documents)
        for start in range(0, len(words) - span + 1, span)[:ITEMS_PER_DOCUMENT]
    ]
    generator.shuffle(starts)
    records = []
    for number, start in starts[:MAX_ITEMS]:
        words = documents[number]
        answer = " ".join(words[start + PASSAGE_WORDS : start + span])
        others = []
        for _ in range(
            100
        ):  # three spans unlike the answer and each other (the same boilerplate may recur)
            other = generator.choice([index for index in range(len(documents)) if index != number])
            at = generator.randrange(0, len(documents[other]) - ANSWER_WORDS + 1)
            candidate = " ".join(documents[other][at : at + ANSWER_WORDS])
            if candidate != answer and candidate not in others:
                others.append(candidate)
            if len(others) == 3:
                break
        else:
            continue
        correct = generator.randrange(4)
        answers = others[:correct] + [answer] + others[correct:]
        records.append(
            {
                "flores_passage": " ".join(words[start : start + PASSAGE_WORDS]),
                "question": "",
                **{f"mc_answer{place}": text for place, text in enumerate(answers, 1)},
                "correct_answer_num": correct + 1,
            }
        )
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(
        "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
        encoding="utf-8",
    )
    return None


def build_heldout_tasks(
    documents: Iterable[tuple[str, dict]], lang: str, folder: Path
) -> tuple[list[TaskConfig], dict[str, str]]:
    """The tasks built from the documents (text, metadata) into `folder`, as eval.tasks entries, and
    why any could not be built."""
    documents = list(documents)
    tasks, skipped = [], {}
    why = build_source_task(documents, folder / SOURCE_TASK)
    if why is None:
        tasks.append(
            TaskConfig(
                layout="sib200", path=str(folder / SOURCE_TASK), language=lang, name=SOURCE_TASK
            )
        )
    else:
        skipped[SOURCE_TASK] = why
    why = build_continuation_task(
        [text for text, _ in documents], folder / f"{CONTINUATION_TASK}.jsonl"
    )
    if why is None:
        tasks.append(
            TaskConfig(
                layout=CONTINUATION,
                path=str(folder / f"{CONTINUATION_TASK}.jsonl"),
                language=lang,
                name=CONTINUATION_TASK,
            )
        )
    else:
        skipped[CONTINUATION_TASK] = why
    return tasks, skipped
