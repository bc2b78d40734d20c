"""Registers a scheduler and a KV-cache manager that say when they are used: the engine
must build them when ``--scheduler-cls counting`` / ``--kv-manager counting`` name them;
and a tool-call parser and a reasoning parser for the OpenAI server's front end."""

from __future__ import annotations

import sys
from typing import Any

from octavo.plugin_api import Registry, hookimpl

OCTAVO_PLUGIN_API = ">=1.0,<2"


@hookimpl
def octavo_register_schedulers(registry: Registry[Any]) -> None:
    from octavo_fixture_custom.parts import CountingScheduler

    registry.register("counting", CountingScheduler)


@hookimpl
def octavo_register_kv_managers(registry: Registry[Any]) -> None:
    from octavo_fixture_custom.parts import CountingKVManager

    registry.register("counting", CountingKVManager)


@hookimpl
def octavo_register_tool_parsers(registry: Registry[Any]) -> None:
    from octavo_fixture_custom.parts import CallTagToolParser

    registry.register("call_tag", CallTagToolParser)


@hookimpl
def octavo_register_reasoning_parsers(registry: Registry[Any]) -> None:
    from octavo_fixture_custom.parts import ReflectReasoningParser

    registry.register("reflect", ReflectReasoningParser)


def say(text: str) -> None:
    print(f"octavo-fixture-custom: {text}", file=sys.stderr, flush=True)
