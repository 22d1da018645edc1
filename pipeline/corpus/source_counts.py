"""Documents and characters per raw file at each point of the clean pipeline: what each filter
removed from each source, for the marker's `sources` metrics and the report.

A `SourceTally` step follows the reader and every step that removes or routes documents. It counts
what reaches it, per raw file (the reader's `raw_file` metadata), and when its task's documents are
through writes `<folder>/<label>/<rank>.json`; what a step took from a file is the difference
between the tallies before and after it. Side files rather than datatrove statistics, whose task
logs print every counter: one per file would fill them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from pipeline.json_files import write_json_atomic

# The tallies that every run has: after the reader, after the held-out-source routing, after the
# held-out split (what is left there is the training split). The filters' tallies come between the
# first two.
READ, HELDOUT_SOURCE, HELDOUT = "read", "heldout_source", "heldout"
# Documents from elsewhere than the raw reader (none in a clean run) are counted under this name.
UNKNOWN_FILE = "(no raw file)"

Counts = dict[str, list[int]]  # raw file -> [documents, characters]


class SourceTally(PipelineStep):
    """Passes every document on, counting documents and characters per raw file."""

    type = "📊 - TALLY"

    def __init__(self, folder: Path, label: str):
        # before PipelineStep.__init__, which names the step's statistics
        self.name = f"Per raw file after {label}"
        super().__init__()
        self.folder = Path(folder)
        self.label = label

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        counts: Counts = {}
        for doc in data:
            entry = counts.setdefault(doc.metadata.get("raw_file", UNKNOWN_FILE), [0, 0])
            entry[0] += 1
            entry[1] += len(doc.text)
            yield doc
        # A resumed task rewrites its own file, as datatrove does its statistics.
        (self.folder / self.label).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.folder / self.label / f"{rank:05d}.json", counts)


def summed_tally(folder: Path, label: str) -> Counts:
    """The counts of one tally, summed over its tasks."""
    totals: Counts = defaultdict(lambda: [0, 0])
    for task_file in sorted(Path(folder, label).glob("*.json")):
        for name, (docs, chars) in json.loads(task_file.read_text(encoding="utf-8")).items():
            totals[name][0] += docs
            totals[name][1] += chars
    return dict(totals)


def tally_order(removers: list[str]) -> list[str]:
    """The tallies of a run whose filters (and duplicate removal) are `removers`, in pipeline order."""
    return [READ, *removers, HELDOUT_SOURCE, HELDOUT]


def per_source(folder: Path, removers: list[str], files: list[str]) -> dict[str, dict]:
    """{raw file: its documents and characters in, kept for training, held out, held out as a whole
    source, and rejected by each of `removers`}, for each of `files` (read or not) and any other
    file a tally saw."""
    order = tally_order(removers)
    tallies = {label: summed_tally(folder, label) for label in order}
    names = list(dict.fromkeys([*files, *(name for counts in tallies.values() for name in counts)]))
    sources = {}
    for name in names:
        remaining = [tallies[label].get(name, [0, 0]) for label in order]
        taken = {
            label: (before[0] - after[0], before[1] - after[1])
            for label, before, after in zip(order[1:], remaining, remaining[1:])
        }
        sources[name] = {
            "docs_in": remaining[0][0],
            "chars_in": remaining[0][1],
            "docs_out": remaining[-1][0],
            "chars_out": remaining[-1][1],
            "docs_heldout": taken[HELDOUT][0],
            "chars_heldout": taken[HELDOUT][1],
            "docs_heldout_source": taken[HELDOUT_SOURCE][0],
            "chars_heldout_source": taken[HELDOUT_SOURCE][1],
            "rejected": {label: taken[label][0] for label in removers},
            "chars_rejected": {label: taken[label][1] for label in removers},
        }
    return sources


def moved_to_heldout(sources: dict[str, dict], moved: Counts) -> dict[str, dict]:
    """`sources` after the held-out top-up moved `moved` ({raw file: [documents, characters]}) out
    of training."""
    updated = {name: dict(entry) for name, entry in sources.items()}
    for name, (docs, chars) in moved.items():
        entry = updated[name]
        entry["docs_out"] -= docs
        entry["chars_out"] -= chars
        entry["docs_heldout"] += docs
        entry["chars_heldout"] += chars
    return updated
