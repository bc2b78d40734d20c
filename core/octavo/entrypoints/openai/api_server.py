"""Running the server: start the engine core, log what is served, serve HTTP with uvicorn.

The engine starts before the port is bound, so a server that answers is one whose model is
loaded, and a model that fails to load ends the command with the load error. On SIGTERM or
SIGINT uvicorn stops accepting, gives running requests ``GRACEFUL_SHUTDOWN_S`` to finish,
then the app's shutdown stops the engine core process.
"""

from __future__ import annotations

import asyncio
import logging

from octavo.config import EngineConfig
from octavo.engine.async_llm import AsyncLLM
from octavo.engine.stat_logger import LoggingStatLogger
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.plugins import get_plugin_host

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5


def log_plugins() -> None:
    records = get_plugin_host().records
    loaded = [r.name for r in records if r.loaded]
    logger.info("plugins loaded: %s", ", ".join(loaded) or "none")
    for record in records:
        if not record.loaded:
            logger.warning("plugin %s skipped: %s", record.name,
                           record.reason.splitlines()[0] if record.reason else "")


async def run_server(config: EngineConfig, settings: ServerSettings) -> None:
    starting = asyncio.ensure_future(AsyncLLM.start(config))
    await asyncio.sleep(0)  # runs start() until it has spawned the core and awaits it
    log_plugins()
    # The engine core loads the model in its own process meanwhile (on another core):
    # the web stack and the tokenizer's modules are imported now, off the critical path.
    import uvicorn

    import octavo.engine.llm_engine  # noqa: F401  (the handshake's tokenizer, the Processor)
    from octavo.entrypoints.openai.app import build_app

    engine = await starting
    if not config.observability.disable_log_stats:
        engine.stat_loggers.append(LoggingStatLogger(config.observability.log_stats_interval))
    try:
        ready = engine.ready
        logger.info("engine core process pid %d: platform %s, model %s, %d KV blocks of %d "
                    "tokens, max_model_len %d", ready.pid, ready.platform, ready.model,
                    ready.num_blocks, ready.block_size, ready.max_model_len)
        logger.info("serving %r at http://%s:%d%s", settings.served_model_name, settings.host,
                    settings.port, " (API key required)" if settings.api_key else "")
        server = uvicorn.Server(uvicorn.Config(
            build_app(engine, settings), host=settings.host, port=settings.port,
            log_level="info", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        await server.serve()
    finally:
        engine.shutdown()  # already done by the app's shutdown unless uvicorn failed
