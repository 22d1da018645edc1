"""The JSON files the stages write and read: markers, plans, reports, checkpoints' state. Written
whole or not at all: a temporary file renamed into place, so that a kill leaves the old file or the
new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(
        json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8"
    )
    os.replace(tmp, path)
