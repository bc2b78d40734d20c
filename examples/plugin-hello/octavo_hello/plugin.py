"""The module named by the entry point: one hook implementation."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"


@hookimpl
def octavo_register_scheduling_policies(registry: Registry[Any]) -> None:
    from octavo_hello.policy import ShortestPromptFirst

    registry.register(ShortestPromptFirst.name, ShortestPromptFirst)
