"""Typed handles to every stage's output, the one module that knows which files each stage leaves in
its folder `${work_dir}/<lang>/<stage>/`: a stage reads
`run.read_input(run.output(MixOutput).plan)`, never a `"plan.json"` of its own
(tests/unit/test_import_layers.py checks that no stage module spells another stage's file names).

A handle is a frozen dataclass of the folder; a file that stages read is an `OutputFile` (the path
and how it is read, so that `StageRun.read_input` names the stage that wrote a damaged one), a
folder or a file handed on to a library a path. The names themselves stay with the libraries that
write and read them (`packed.json` is the sampler's, `tokenizer.json` the tokenizer folder's, `hf/`
the training stage's export): a default is written in one place, and the handles gather them per
stage.

Why a module of its own rather than a part of pipeline/contract.py: the contract is the ground
floor, which runs any stage whatever its files and imports nothing above it; the handles import the
libraries' names, so they sit above the libraries, beside the contract, for the stages and the
workflow (DESIGN, the layers: "contract, stage outputs"). They import no torch: a reader that needs
it imports it when it reads, so that the data stages still start without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, TypeVar

from tokenizers import Tokenizer

from pipeline.corpus.report import REPORT_TEXT_FILE as CLEAN_REPORT_TEXT
from pipeline.corpus.sources import HELDOUT_SPLIT, TRAIN_SPLIT, SourceInput, clean_output
from pipeline.evaluation.report import REPORT_FILE as EVALUATE_REPORT
from pipeline.evaluation.report import REPORT_TEXT_FILE as EVALUATE_REPORT_TEXT
from pipeline.json_files import read_json
from pipeline.mixing.report import PLAN_FILE, PLAN_TEXT_FILE
from pipeline.packing.packed import PACKED_FILE
from pipeline.tokenization.folder import SPECIAL_TOKENS_FILE, TOKENIZER_FILE, load_tokenizer
from pipeline.tokenization.report import REPORT_FILE as TOKENIZER_REPORT
from pipeline.tokenization.report import REPORT_TEXT_FILE as TOKENIZER_REPORT_TEXT
from pipeline.run_folders import current_marker
from pipeline.training.job import EXPORT, FINAL_STATE, HELDOUT_FILE, METRICS_FILE, TRAINED
from pipeline.work_folder import MARKER, OutputFile, resolve_path, stage_dir

H = TypeVar("H", bound="StageOutput")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class StageOutput:
    """A stage's output folder; `stage` names the stage (`StageRun.output` finds the folder by it)."""

    stage: ClassVar[str]
    folder: Path

    @classmethod
    def at(cls: type[H], cfg) -> H:
        """The stage's output for cfg's language, done or not."""
        return cls(stage_dir(cfg, cls.stage))

    @property
    def marker_file(self) -> Path:
        return self.folder / MARKER

    @property
    def marker(self) -> Optional[dict]:
        """The marker, None while the stage is not done (or, for a named run's link to another
        run's output, when that output changed since: pipeline/run_folders.py)."""
        return current_marker(self.folder)


@dataclass(frozen=True)
class CleanOutput(StageOutput):
    """Filtered, deduplicated JSONL shards in splits (pipeline/corpus/sources.py) and the report."""

    stage: ClassVar[str] = "clean"

    def training_text(self, name: str) -> SourceInput:
        return clean_output(name, self.folder, split=TRAIN_SPLIT)

    def heldout_text(self, name: str) -> SourceInput:
        return clean_output(name, self.folder, split=HELDOUT_SPLIT)

    @property
    def report_text(self) -> OutputFile[str]:
        return OutputFile(self.folder / CLEAN_REPORT_TEXT, _text)


@dataclass(frozen=True)
class ReplayOutput(StageOutput):
    """The base model's own samples, as the training split of a clean output (the mix reads it so)."""

    stage: ClassVar[str] = "replay"

    @property
    def training_split(self) -> Path:
        return self.folder / TRAIN_SPLIT


@dataclass(frozen=True)
class MixOutput(StageOutput):
    """The estimated plan (pipeline/mixing/report.py), as data and as a table."""

    stage: ClassVar[str] = "mix"

    @property
    def plan(self) -> OutputFile[dict]:
        return OutputFile(self.folder / PLAN_FILE, read_json)

    @property
    def plan_text(self) -> OutputFile[str]:
        return OutputFile(self.folder / PLAN_TEXT_FILE, _text)


@dataclass(frozen=True)
class TokenizerOutput(StageOutput):
    """A tokenizer folder (pipeline/tokenization/folder.py) and the report on it."""

    stage: ClassVar[str] = "tokenizer"

    @property
    def tokenizer(self) -> OutputFile[Tokenizer]:
        return OutputFile(self.folder / TOKENIZER_FILE, load_tokenizer)

    @property
    def special_tokens(self) -> OutputFile[dict]:
        """The special tokens by role (`eos_token` ...)."""
        return OutputFile(self.folder / SPECIAL_TOKENS_FILE, read_json)

    @property
    def report(self) -> OutputFile[dict]:
        return OutputFile(self.folder / TOKENIZER_REPORT, read_json)

    @property
    def report_text(self) -> OutputFile[str]:
        return OutputFile(self.folder / TOKENIZER_REPORT_TEXT, _text)


@dataclass(frozen=True)
class PackOutput(StageOutput):
    """The packed shards, which the sampler reads from the folder, and the exact plan
    (pipeline/packing/packed.py)."""

    stage: ClassVar[str] = "pack"

    @property
    def packed(self) -> OutputFile[dict]:
        return OutputFile(self.folder / PACKED_FILE, read_json)


def _opened_checkpoint(path: Path):
    from pipeline.model.model_tensors import (
        opened_checkpoint,
    )  # torch: only when a checkpoint is read

    return opened_checkpoint(path)


def _heldout_rows(path: Path):
    from pipeline.training.heldout import load_rows  # torch: only when the rows are read

    return load_rows(path)


@dataclass(frozen=True)
class TrainedModelOutput(StageOutput):
    """A training stage's trained model (pipeline/training/job.py: its files), its own held-out rows
    and metrics."""

    @property
    def export(self) -> Path:
        """The trained model as a transformers folder, with its tokenizer."""
        return self.folder / EXPORT

    @property
    def checkpoint(self) -> OutputFile:
        """The trained model as a pipeline checkpoint, opened (model/model_tensors.py)."""
        return OutputFile(self.folder / TRAINED, _opened_checkpoint)

    @property
    def heldout_rows(self) -> OutputFile:
        """The held-out rows it scored (evaluation/bits_per_byte.py's ScoringRows)."""
        return OutputFile(self.folder / HELDOUT_FILE, _heldout_rows)

    @property
    def metrics(self) -> Path:
        """Its metrics.jsonl: loss and held-out bits per byte against training tokens."""
        return self.folder / METRICS_FILE

    @property
    def logged_heldout_bpb(self) -> Optional[float]:
        """The held-out bits per byte it logged at the end, on its held-out rows; None where it has
        none."""
        return ((self.marker or {}).get("metrics") or {}).get("heldout_bpb_after")


@dataclass(frozen=True)
class WarmupOutput(TrainedModelOutput):
    stage: ClassVar[str] = "warmup"

    def recorded_base(self, work_dir: str) -> Optional[str]:
        """The base model it warm-started (its marker records it), in the work folder `work_dir`
        wherever it is now; None while it is not done."""
        marker = self.marker
        return (
            str(resolve_path(work_dir, marker["metrics"]["base"])) if marker is not None else None
        )


@dataclass(frozen=True)
class PretrainOutput(TrainedModelOutput):
    stage: ClassVar[str] = "pretrain"

    @property
    def final_state(self) -> Path:
        """The folder of the training state of its last step, which init=continue:<run> starts
        from (pipeline/training/run.py: `final_state` finds the checkpoint in it)."""
        return self.folder / FINAL_STATE


@dataclass(frozen=True)
class EvaluateOutput(StageOutput):
    """The report on every model (pipeline/evaluation/report.py)."""

    stage: ClassVar[str] = "evaluate"

    @property
    def report(self) -> OutputFile[dict]:
        return OutputFile(self.folder / EVALUATE_REPORT, read_json)

    @property
    def report_text(self) -> OutputFile[str]:
        return OutputFile(self.folder / EVALUATE_REPORT_TEXT, _text)


# The training stages' outputs, in the recipe's order: the models the evaluate stage scores after
# the base.
TRAINED_OUTPUTS: tuple[type[TrainedModelOutput], ...] = (WarmupOutput, PretrainOutput)
STAGE_OUTPUTS: tuple[type[StageOutput], ...] = (
    CleanOutput,
    ReplayOutput,
    MixOutput,
    TokenizerOutput,
    PackOutput,
    *TRAINED_OUTPUTS,
    EvaluateOutput,
)
