"""Reading the JSON files of an HF folder with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octavo.models.loader.errors import ModelLoadError


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; any problem is a ModelLoadError naming the file."""
    if not path.is_file():
        raise ModelLoadError(f"{path.parent}: no {path.name} in the model folder")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(content, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(content).__name__}")
    return content
