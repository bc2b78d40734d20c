"""Opening a GGUF file and reading its key/value metadata as plain Python values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, ReaderField, ReaderTensor

from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.gguf_layout import check_gguf_layout


def _field_value(field: ReaderField) -> Any:
    """A field's value: a str, a number, a bool, or a list of those for array fields."""

    def item(part_index: int, value_type: GGUFValueType) -> Any:
        part = field.parts[part_index]
        if value_type == GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        return part[0].item()

    if field.types[0] == GGUFValueType.ARRAY:
        return [item(i, field.types[-1]) for i in field.data]
    return item(field.data[0], field.types[0])


class GgufFile:
    """A memory-mapped GGUF: metadata by key, tensors by llama.cpp name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        check_gguf_layout(path)  # GGUFReader trusts its counts and offsets
        try:
            self.reader = GGUFReader(path)
        except (OSError, ValueError, IndexError) as e:
            raise ModelLoadError(f"{path}: not a readable GGUF file: {e}") from e
        self.tensors: dict[str, ReaderTensor] = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else _field_value(field)

    def require(self, key: str) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            raise ModelLoadError(f"{self.path}: GGUF metadata lacks the required key {key!r}")
        return _field_value(field)

    @property
    def architecture(self) -> str:
        return self.require("general.architecture")
