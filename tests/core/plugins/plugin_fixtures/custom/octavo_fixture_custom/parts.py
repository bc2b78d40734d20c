"""The default scheduler and KV manager, counting their work and saying so at exit; a
tool-call format ``<call>name {json}</call>`` and ``<reflect>`` reasoning."""

from __future__ import annotations

import atexit
import json
from typing import Any

from octavo.plugin_api import (
    CallText,
    KVCacheManager,
    ReasoningParser,
    Scheduler,
    SchedulerOutput,
    ToolParser,
)
from octavo_fixture_custom.plugin import say


class CountingScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = 0
        say(f"scheduler built with {type(self.kv_manager).__name__}")
        atexit.register(lambda: say(f"scheduler planned {self.steps} steps"))

    def schedule(self) -> SchedulerOutput:
        self.steps += 1
        return super().schedule()


class CountingKVManager(KVCacheManager):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        say(f"KV manager built with {self.pool.num_blocks} blocks")


class CallTagToolParser(ToolParser):
    start = ("<call>",)
    call_format = ("<call>{name} ", "</call>")

    def read_calls(self, text: str, start: int) -> list[CallText]:
        body = text[start + len("<call>"):]
        name, named, rest = body.partition(" ")
        arguments, closed, _ = rest.partition("</call>")
        if closed:
            json.loads(arguments)  # a JSONDecodeError is a ValueError: plain text after all
        return [CallText(name if named else None, arguments, bool(closed))]


class ReflectReasoningParser(ReasoningParser):
    start, end = "<reflect>", "</reflect>"
