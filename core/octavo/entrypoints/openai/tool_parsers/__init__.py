"""Tool-call parsers (vLLM's ``--tool-call-parser NAME``): the built-ins below, and those
plugins register through the ``octavo_register_tool_parsers`` hook."""

from __future__ import annotations

from octavo.entrypoints.openai.parser_registry import find_parser, parser_names
from octavo.entrypoints.openai.tool_parsers.base import CallText, Parsed, ToolParser
from octavo.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from octavo.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from octavo.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from octavo.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from octavo.plugins import get_registries

BUILTIN_TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}

__all__ = ["CallText", "Parsed", "ToolParser", "get_tool_parser", "tool_parser_names"]


def get_tool_parser(name: str) -> ToolParser:
    return find_parser(BUILTIN_TOOL_PARSERS, get_registries().tool_parsers, name)()


def tool_parser_names() -> list[str]:
    return parser_names(BUILTIN_TOOL_PARSERS, get_registries().tool_parsers)
