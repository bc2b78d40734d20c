"""The ``octavo`` logger: INFO to stderr by default, as vLLM does, so start-up facts (model,
platform, KV blocks) are visible without configuration. ``OCTAVO_LOGGING_LEVEL`` changes the
level; an application that configures the ``octavo`` logger itself keeps its own handlers."""

from __future__ import annotations

import logging
import os
import time

FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def init_logger() -> logging.Logger:
    logger = logging.getLogger("octavo")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(os.environ.get("OCTAVO_LOGGING_LEVEL", "INFO").upper())
        logger.propagate = False
    return logger


class RateLimitFilter(logging.Filter):
    """Let each message template through at most once per ``interval_s``; the next one that
    passes says how many were suppressed meanwhile.

    Why: a flood of identical failures (20,000 half-open connections, each "Too many open
    files"; a peer pushing garbage frames) must not turn into gigabytes of log, yet the
    first line of each kind still shows at once.
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg).split("\n", 1)[0])  # asyncio: 1st line
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar messages suppressed in the last " \
                         f"{self.interval_s:g} s)"
        return True
