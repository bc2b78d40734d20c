"""Where JSON values end in text that may still be growing: the tool-call parsers stream a
call's arguments as the model writes them, so they must tell a value cut short by the end of
the text (``None``) from a finished one, without parsing it.

Only positions are computed (strings, escapes and nesting tracked character by character);
the text of a finished value is handed to ``json.loads`` by the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\r\n"
_SCALAR_END = ",}] \t\r\n"


class NotJSON(ValueError):
    """The text cannot be the JSON the parser expects (it is plain text after all)."""


def skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in WHITESPACE:
        index += 1
    return index


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that begins at ``text[start]``; None when the text
    ends before the value does. Raises ``NotJSON`` on a character no value can hold."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in "{[":
        return _container_end(text, start)
    if first in "-0123456789tfn":
        index = start
        while index < len(text) and text[index] not in _SCALAR_END:
            index += 1
        return index if index < len(text) else None  # a number may still be growing
    raise NotJSON(f"no JSON value starts with {first!r}")


def _string_end(text: str, start: int) -> int | None:
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == '"':
            return index + 1
        index += 1
    return None


def _container_end(text: str, start: int) -> int | None:
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == '"':
            end = _string_end(text, index)
            if end is None:
                return None
            index = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return None


@dataclass
class Member:
    """One ``"key": value`` of an object: where its value starts and ends (None: not yet)."""

    key: str
    start: int
    end: int | None


def object_members(text: str, start: int) -> tuple[list[Member], int | None]:
    """The members of the object that opens at ``text[start]`` (``{``) so far, and the index
    past its closing brace (None while it is open). A key still being written is left out."""
    if start >= len(text) or text[start] != "{":
        raise NotJSON("not an object")
    members: list[Member] = []
    index = skip_space(text, start + 1)
    if index < len(text) and text[index] == "}":
        return members, index + 1
    while index < len(text):
        if text[index] != '"':
            raise NotJSON(f"expected a key, got {text[index]!r}")
        key_end = _string_end(text, index)
        if key_end is None:
            return members, None
        key = json.loads(text[index:key_end])
        index = skip_space(text, key_end)
        if index >= len(text):
            return members, None
        if text[index] != ":":
            raise NotJSON(f"expected ':', got {text[index]!r}")
        index = skip_space(text, index + 1)
        if index >= len(text):
            return members, None
        end = value_end(text, index)
        members.append(Member(key, index, end))
        if end is None:
            return members, None
        index = skip_space(text, end)
        if index >= len(text):
            return members, None
        if text[index] == "}":
            return members, index + 1
        if text[index] != ",":
            raise NotJSON(f"expected ',' or '}}', got {text[index]!r}")
        index = skip_space(text, index + 1)
    return members, None
