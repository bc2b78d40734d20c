"""What the server does about a stalled engine (see ``octavo.engine.stall_watch``): ``/health``
answers 503 with the reason and new requests get 503 with Retry-After while any engine is
stalled; ``octavo:engine_stalled`` shows it per engine; with ``--engine-stall-action fail``
the requests in flight end with an error (``keep``, the default, lets them wait for the
engine to resume). All of it ends when the engine steps again."""

from __future__ import annotations

import logging
import time

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.errors import EngineStalledError
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.settings import ServerSettings

logger = logging.getLogger(__name__)


def stall_reason(engine: AsyncLLM) -> str | None:
    """Why the server is stalled, naming each stalled engine; None when none is."""
    silences = engine.stall_watch.silences(time.monotonic())
    if not silences:
        return None
    engines = ", ".join(f"engine {index} for {seconds:.1f} s"
                        for index, seconds in sorted(silences.items()))
    return (f"stalled: with work to do, no step finished ({engines}; "
            f"--engine-stall-timeout {engine.stall_watch.timeout_s:g})")


def check_not_stalled(engine: AsyncLLM, settings: ServerSettings) -> None:
    """503 with Retry-After while an engine is stalled: a new request would only wait."""
    reason = stall_reason(engine)
    if reason is not None:
        raise OpenAIError(503, f"the engine is {reason}; retry later", code="engine_stalled",
                          headers={"Retry-After": str(settings.retry_after_s)})


class StallMonitor:
    """Logs each stall and its end, and applies ``--engine-stall-action`` (called by the
    supervisor's watch loop)."""

    def __init__(self, engine: AsyncLLM, fail_requests: bool) -> None:
        self.engine = engine
        self.fail_requests = fail_requests
        self._stalled = False

    def check(self) -> None:
        reason = stall_reason(self.engine)
        if (reason is not None) != self._stalled:
            self._stalled = reason is not None
            if reason is not None:
                logger.error("the engine is %s", reason)
            else:
                logger.warning("the engine steps again: no longer stalled")
        if reason is not None and self.fail_requests and self.engine.num_unfinished_requests:
            logger.error("ending %d requests (--engine-stall-action fail)",
                         self.engine.num_unfinished_requests)
            self.engine.fail_running(EngineStalledError(f"the engine is {reason}"))
