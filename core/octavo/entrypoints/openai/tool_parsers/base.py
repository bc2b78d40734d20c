"""``ToolParser``: how one family of models writes tool calls into its text, both ways -
reading calls out of the output (whole, or as it streams), and the structural tag that holds
a call's arguments to the tool's JSON schema once the model opens one.

A parser names the text that opens its calls (``start``); everything before it is the
reply's content. While a reply streams, the end of the text that could still become the
start of a call is held back, so no client ever sees half a marker as content.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from octavo.entrypoints.openai.text_markers import held_back
from octavo.entrypoints.openai.tool_parsers.json_scan import Member, NotJSON

ARGUMENT_KEYS = ("arguments", "parameters")  # models spell the arguments' key either way


@dataclass
class CallText:
    """One call as far as the model has written it."""

    name: str | None  # None until the name is complete
    arguments: str = ""  # the arguments' JSON text so far (all of it once ``done``)
    done: bool = False
    # The arguments are a JSON string holding the JSON (some models write them so): nothing
    # of them can be streamed until the string is complete and decoded.
    quoted: bool = False


@dataclass
class Parsed:
    content: str  # the text that is not part of a call (so far)
    calls: list[CallText] = field(default_factory=list)


class ToolParser(ABC):
    """Subclass it, set ``start`` and implement ``read_calls``; set ``call_format`` for the
    arguments to be constrained (``--enable-auto-tool-choice``)."""

    # The texts that open the calls (the first found wins); the first one also triggers
    # the structural tag.
    start: ClassVar[tuple[str, ...]]
    # begin and end of one call of the tool ``{name}`` around its arguments' JSON, for the
    # structural tag; None: this format's arguments are not JSON and stay unconstrained.
    call_format: ClassVar[tuple[str, str] | None] = None

    @abstractmethod
    def read_calls(self, text: str, start: int) -> list[CallText]:
        """The calls in ``text`` from ``start`` (where a start marker is) on, the last one
        possibly unfinished. Raises ``ValueError`` (``NotJSON``) when the text there is not
        calls after all."""

    def parse(self, text: str, final: bool) -> Parsed:
        """``text`` split into content and calls. Until ``final`` the text may stop anywhere,
        and content that could be the beginning of a start marker is held back. Text that
        turns out not to be calls is content."""
        found = [i for i in (text.find(marker) for marker in self.start) if i >= 0]
        if not found:
            return Parsed(text if final else text[:len(text) - held_back(text, self.start)])
        first = min(found)
        try:
            calls = self.read_calls(text, first)
        except ValueError:  # NotJSON, or a plugin parser's json.loads
            return Parsed(text)
        if final and not all(call.done and call.name for call in calls):
            return Parsed(text)  # cut short (max_tokens): the text as it is
        return Parsed(text[:first], calls)

    def structural_tag(self, tools: list[dict[str, Any]]) -> dict[str, Any] | None:
        """xgrammar's structural tag that lets the text run free until the model opens a call,
        then holds the call to one of ``tools`` (OpenAI ``function`` dicts) and its schema."""
        if self.call_format is None:
            return None
        begin, end = self.call_format
        tags = [{"type": "tag", "begin": begin.replace("{name}", json.dumps(tool["name"])[1:-1]),
                 "content": {"type": "json_schema", "json_schema": tool["parameters"]},
                 "end": end} for tool in tools]
        return {"type": "structural_tag",
                "format": {"type": "triggered_tags", "triggers": [self.start[0]], "tags": tags}}

    def new_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"


def call_from_object(text: str, members: list[Member], done: bool) -> CallText:
    """A call written as ``{"name": ..., "arguments"|"parameters": {...}}`` (members from
    ``json_scan.object_members``); ``done``: the object is closed."""
    by_key = {member.key: member for member in members}
    name_member = by_key.get("name")
    name = None
    if name_member is not None and name_member.end is not None:
        name = json.loads(text[name_member.start:name_member.end])
        if not isinstance(name, str):
            raise NotJSON("a call's name must be a string")
    args = next((by_key[key] for key in ARGUMENT_KEYS if key in by_key), None)
    if args is None:
        return CallText(name, "{}" if done else "", done)
    raw = text[args.start:args.end]
    if raw.startswith('"'):  # arguments given as a JSON string
        if args.end is None:
            return CallText(name, "", False, quoted=True)
        return CallText(name, json.loads(raw), done, quoted=True)
    return CallText(name, raw, done and args.end is not None)
