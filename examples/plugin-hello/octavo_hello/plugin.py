"""The module named by the entry point: one hook implementation."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_scheduling_policies(registry: Registry[Any]) -> None:
    from octavo_hello.policy import ShortestPromptFirst

    registry.register(ShortestPromptFirst.name, ShortestPromptFirst)
