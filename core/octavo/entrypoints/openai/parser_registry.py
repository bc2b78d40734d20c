"""Looking up the tool-call and reasoning parsers by name: the core's built-ins, then those
plugins register (hooks ``octavo_register_tool_parsers`` and
``octavo_register_reasoning_parsers``; see docs/plugins.md)."""

from __future__ import annotations

from typing import TypeVar

from octavo.plugins.registry import Registry

T = TypeVar("T")


def parser_names(builtins: dict[str, type[T]], registry: Registry[type[T]]) -> list[str]:
    return [*builtins, *(name for name in registry.names() if name not in builtins)]


def find_parser(builtins: dict[str, type[T]], registry: Registry[type[T]],
                name: str) -> type[T]:
    """The parser class ``name``, a built-in or a plugin's; ``ValueError`` listing the known
    names when there is none."""
    if name in builtins:
        return builtins[name]
    if name in registry.names():
        return registry.get(name)
    known = ", ".join(parser_names(builtins, registry))
    raise ValueError(f"unknown {registry.kind} {name!r}; choose from {known}")
