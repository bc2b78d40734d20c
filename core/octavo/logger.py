"""The ``octavo`` logger: INFO to stderr by default, as vLLM does, so start-up facts (model,
platform, KV blocks) are visible without configuration. ``OCTAVO_LOGGING_LEVEL`` changes the
level; an application that configures the ``octavo`` logger itself keeps its own handlers."""

from __future__ import annotations

import logging
import os

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
