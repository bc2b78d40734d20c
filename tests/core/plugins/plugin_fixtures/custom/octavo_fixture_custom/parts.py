"""The default scheduler and KV manager, counting their work and saying so at exit."""

from __future__ import annotations

import atexit
from typing import Any

from octavo.plugin_api import KVCacheManager, Scheduler, SchedulerOutput
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
