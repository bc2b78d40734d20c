"""Reading the values users type: JSON objects (``--speculative-config``,
``--kv-transfer-config``), memory sizes (``--kv-cache-memory 4GiB``) and positive integers.
Every failure is a ``ConfigError`` naming the setting."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from octavo.config.errors import ConfigError

_MEMORY_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6,
                 "gb": 10**9, "k": 2**10, "m": 2**20, "g": 2**30, "b": 1}


def parse_json_object(value: str | dict[str, Any], name: str) -> dict[str, Any]:
    """A dict as given, or the JSON object a string holds."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def check_known_keys(keys: dict[str, Any], part: Any, name: str) -> None:
    """Every key must be a field of the dataclass ``part``; the error lists the known ones."""
    known = {f.name for f in fields(part)}
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ConfigError(f"{name}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")


def parse_memory(text: str | int) -> int:
    """'4GiB', '512MB', '1e9' or an int -> bytes (``--kv-cache-memory``)."""
    if isinstance(text, int):
        return text
    s = text.strip().lower()
    unit = next((u for u in _MEMORY_UNITS if s.endswith(u)), "")
    number, scale = s[: len(s) - len(unit)].strip(), _MEMORY_UNITS.get(unit, 1)
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a memory size (e.g. 4GiB, 512MiB)") from None
    if value <= 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(value)


def check_positive_ints(owner: str, **values: Any) -> None:
    """Each value must be an int of at least 1 (bools are not ints here)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{owner}{name} must be a positive integer, got {value!r}")
