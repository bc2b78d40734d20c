"""Reasoning parsers (vLLM's ``--reasoning-parser NAME``): the text a model writes between
``<think>`` and ``</think>`` is its reasoning (``message.reasoning``, streamed as
``delta.reasoning``), what follows is the answer (``content``).

Where the reply begins matters: DeepSeek-R1's template opens ``<think>`` in the prompt (or
the model writes it), so R1 replies always start in their reasoning; Qwen3 replies start in
it when the prompt ends with ``<think>``, are all answer when it ends with an empty think
block (``chat_template_kwargs: {"enable_thinking": false}``), and otherwise may think first
(the model writes ``<think>``).

Guided decoding applies to the answer only: ``answer_only`` wraps a constraint in a
structural tag whose reasoning part is free text up to ``</think>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from octavo.entrypoints.openai.parser_registry import find_parser, parser_names
from octavo.entrypoints.openai.text_markers import held_back
from octavo.plugins import get_registries
from octavo.sampling_params import StructuredOutputsParams


class Opening(Enum):
    """How the prompt leaves the reply's reasoning."""

    IN_REASONING = "in"  # the reply starts inside it
    MAY_THINK = "may"  # the reply may open a think block first
    ANSWER = "answer"  # the prompt closed it: the reply is the answer


@dataclass
class Split:
    reasoning: str | None
    content: str | None


class ReasoningParser:
    """Subclass it to change the tags or where replies start (``opening``)."""

    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"

    def opening(self, prompt: str) -> Opening:
        """Where a reply to ``prompt`` (the rendered chat) starts: templates open or close
        the reply's think block at the very end of the prompt (tags earlier on belong to
        the conversation)."""
        tail = prompt.rstrip()
        if tail.endswith(self.start):
            return Opening.IN_REASONING
        return Opening.ANSWER if tail.endswith(self.end) else Opening.MAY_THINK

    def split(self, text: str, opening: Opening, final: bool) -> Split:
        """``text`` split at the tags. Until ``final`` the text may stop anywhere, and what
        could still be the start of a tag is held back."""
        body = text.lstrip()
        if opening is not Opening.ANSWER:
            if body.startswith(self.start):
                text, opening = body[len(self.start):], Opening.IN_REASONING
            elif not final and self.start.startswith(body):
                return Split(None, None)  # nothing yet, or the start of "<think>"
        if opening is not Opening.IN_REASONING:
            return Split(None, text)
        position = text.find(self.end)
        if position < 0:
            shown = text if final else text[:len(text) - held_back(text, (self.end,))]
            return Split(shown, None)
        return Split(text[:position], text[position + len(self.end):])

    def answer_only(self, constraint: StructuredOutputsParams,
                    opening: Opening) -> StructuredOutputsParams:
        """``constraint`` on the answer, the reasoning before it free."""
        if opening is Opening.ANSWER:
            return constraint
        think: dict[str, Any] = {"type": "tag", "begin": "", "content": {"type": "any_text"},
                                 "end": self.end}
        if opening is Opening.MAY_THINK:
            think = {"type": "optional", "content": {**think, "begin": self.start}}
        return StructuredOutputsParams(structural_tag={
            "type": "structural_tag",
            "format": {"type": "sequence", "elements": [think, answer_format(constraint)]}})


class DeepSeekR1ReasoningParser(ReasoningParser):
    def opening(self, prompt: str) -> Opening:
        return Opening.IN_REASONING  # R1 thinks first, whether or not it writes <think>


class Qwen3ReasoningParser(ReasoningParser):
    pass  # the prompt decides (see the module docstring)


def answer_format(constraint: StructuredOutputsParams) -> dict[str, Any]:
    """A constraint as a structural tag's format."""
    kind = constraint.kind
    if kind == "json":
        return {"type": "json_schema", "json_schema": constraint.json}
    if kind == "json_object":
        return {"type": "json_schema", "json_schema": {"type": "object"}}
    if kind == "regex":
        return {"type": "regex", "pattern": constraint.regex}
    if kind == "grammar":
        return {"type": "grammar", "grammar": constraint.grammar}
    if kind == "choice":
        return {"type": "or", "elements": [{"type": "const_string", "value": choice}
                                           for choice in json.loads(constraint.spec)]}
    tag = constraint.structural_tag if isinstance(constraint.structural_tag, dict) else {}
    if "structures" in tag:
        from octavo.structured.grammar import legacy_structural_tag  # xgrammar: when needed

        tag = legacy_structural_tag(tag)
    answer = tag.get("format")
    return dict(answer) if isinstance(answer, dict) else {}


BUILTIN_REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    return find_parser(BUILTIN_REASONING_PARSERS, get_registries().reasoning_parsers, name)()


def reasoning_parser_names() -> list[str]:
    return parser_names(BUILTIN_REASONING_PARSERS, get_registries().reasoning_parsers)
