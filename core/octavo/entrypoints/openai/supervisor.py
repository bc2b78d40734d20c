"""What the API server does when its engine core dies or it is told to stop.

Engine death is final and visible (vLLM's behaviour): the requests in flight have already
failed with an error (their streams end with an error event and ``[DONE]``); the server
then exits non-zero within a few seconds, so a supervisor (systemd, Kubernetes) restarts
it - a server that stays up answering 503 forever is worse than one that is restarted.
With ``--restart-engine`` it restarts the engine core itself instead, with backoff, and
``/health`` says it is restarting meanwhile.

On SIGTERM/SIGINT uvicorn stops accepting and lets running requests finish; after
``--shutdown-timeout`` seconds the engine is stopped, which ends every request still
running with an error (a stream: an error event, then ``[DONE]``), so no client is cut
off mid-stream without a word.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
from types import FrameType

import uvicorn

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.errors import EngineDeadError, EngineStartError
from octavo.entrypoints.openai.stall import StallMonitor

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.1
DEATH_GRACE_S = 2  # seconds, for the failed requests' error responses to go out
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # between failed restarts, then 30 s


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopping the engine ``shutdown_timeout_s`` after a stop signal."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM,
                 shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s
        self._drain: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A signal handler: only schedule, the loop runs the rest.
        self._loop.call_soon_threadsafe(self._start_drain, signal.Signals(sig).name)

    def _start_drain(self, signal_name: str) -> None:
        if self._drain is not None:
            return
        logger.info("%s: no new connections; running requests have %g s to finish "
                    "(--shutdown-timeout)", signal_name, self.shutdown_timeout_s)
        self._drain = self._loop.call_later(self.shutdown_timeout_s, self._end_requests)

    def _end_requests(self) -> None:
        running = self.engine.num_unfinished_requests
        if running:
            logger.warning("shutdown timeout: ending %d running requests with an error",
                           running)
        self.engine.shutdown()


async def supervise(engine: AsyncLLM, server: uvicorn.Server, restart: bool,
                    stalls: StallMonitor) -> None:
    """Watch the engine core until the server stops; on its death, restart it, or stop the
    server and raise ``EngineDeadError`` (``octavo serve`` then exits with code 1). A
    stall is ``stalls``'s to handle."""
    while not server.should_exit:
        await asyncio.sleep(WATCH_INTERVAL_S)
        stalls.check()
        if engine.is_running() or server.should_exit:
            continue
        if not restart:
            logger.error("the engine core died; the server exits so that it can be restarted "
                         "(or run it with --restart-engine)")
            server.config.timeout_graceful_shutdown = DEATH_GRACE_S
            server.should_exit = True
            raise EngineDeadError("the engine core died")
        await _restart(engine)


async def _restart(engine: AsyncLLM) -> None:
    for attempt in itertools.count(1):
        logger.warning("restarting the engine core (attempt %d)", attempt)
        try:
            await engine.restart()
        except EngineStartError as exc:
            delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S)) - 1]
            logger.error("engine core restart failed: %s; next try in %g s", exc, delay)
            await asyncio.sleep(delay)
        else:
            logger.info("engine core restarted: pid %d", engine.ready.pid)
            return

