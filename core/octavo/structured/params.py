"""``StructuredOutputsParams``: the constraint a request's output must satisfy (vLLM's name
and fields). Exactly one kind is set: a JSON schema, any JSON object, a regex, a choice of
strings, or an EBNF grammar.

Plain data with no xgrammar import, so it travels inside ``SamplingParams`` (msgspec) to the
engine core; checking that the schema, regex or grammar itself is well-formed is
``octavo.structured.validate``'s job, in the front end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema, as a dict or its JSON text
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # EBNF (xgrammar's dialect, GBNF-like), start rule ``root``

    def __post_init__(self) -> None:
        chosen = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError("structured outputs need exactly one of "
                             f"{', '.join(KINDS)}; got {', '.join(chosen) or 'none'}")
        if self.json_object is not True and self.json_object is not False:
            raise ValueError(f"structured json_object must be a bool, got {self.json_object!r}")
        if isinstance(self.json, str):
            self.json = _parse_schema_text(self.json)
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"structured json must be a JSON schema object (a dict or its "
                             f"JSON text), got {type(self.json).__name__}")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured choice must be a non-empty list of non-empty "
                                 f"strings, got {self.choice!r}")
        for kind in ("regex", "grammar"):
            value = getattr(self, kind)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured {kind} must be a non-empty string, got {value!r}")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as one canonical string: with ``kind``, the grammar cache's key."""
        value = getattr(self, self.kind)
        if self.kind == "json":
            return json.dumps(value, separators=(",", ":"))  # key order matters: it is the output's
        if self.kind == "choice":
            return json.dumps(value)
        return "" if self.kind == "json_object" else str(value)


def _parse_schema_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"structured json is not valid JSON: {exc}") from None
