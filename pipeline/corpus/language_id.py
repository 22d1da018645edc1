"""Language identification blocks: a local GlotLID/fastText model, or the corpus' own label.

datatrove's LanguageFilter downloads its model; ours loads it from a local file (no network at run
time). Without a model the stage trusts the `lang` field that HPLT and most corpora carry.
"""

from __future__ import annotations

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.filters.language_filter import LanguageFilter
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.lid import FastTextLID


def accepted_labels(lang) -> set[str]:
    """Every code or label that names `lang` (a LanguageConfig), lower-cased."""
    names = [lang.code, lang.hplt_code, lang.iso639_1, *lang.aliases, *lang.glotlid]
    return {str(n).lower() for n in names if n}


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


class LocalLanguageFilter(LanguageFilter):
    """Keeps documents whose score for one of the language's labels exceeds the threshold."""

    def __init__(self, model_path: str, labels: list[str], threshold: float, exclusion_writer: DiskWriter = None):
        backend = "glotlid" if all("_" in label for label in labels) else "ft176"
        super().__init__(labels, threshold, exclusion_writer, backend="ft176")
        self.backend = backend
        self.model = LocalFastTextLID(model_path, labels)


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
