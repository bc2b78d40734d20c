"""``ConfigReader``: field access on an HF ``config.json`` dict with errors that name the
file and the field (``ModelLoadError``), shared by the config readers of ``models``."""

from __future__ import annotations

from typing import Any

from octavo.models.loader import ModelLoadError


class ConfigReader:
    """Field access on the raw dict with errors that say which file and field are wrong."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def error(self, key: str, problem: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: config field {key!r}: {problem}")

    def positive_int(self, key: str) -> int:
        if key not in self.raw:
            raise self.error(key, "is missing")
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(key, f"must be a positive integer, got {value!r}")
        return value

    def optional(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        return default if value is None else value

    def optional_float(self, key: str) -> float | None:
        """A positive number, or None where the config leaves it out or sets it null."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.error(key, f"must be a positive number or null, got {value!r}")
        return float(value)
