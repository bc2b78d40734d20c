"""Running the server: start the engine core, log what is served, serve HTTP with uvicorn.

The engine starts before the port is bound, so a server that answers is one whose model is
loaded, and a model that fails to load ends the command with the load error. The app is
wrapped in the limits on what one client may hold (``body_limit``, ``http_guard``);
``supervisor`` decides what engine death and stop signals do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from octavo.config import EngineConfig
from octavo.engine.async_llm import AsyncLLM
from octavo.engine.heap import freeze_startup_heap
from octavo.engine.stat_logger import LoggingStatLogger
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.plugins import get_plugin_host

logger = logging.getLogger(__name__)

GRACE_BACKSTOP_S = 5  # past the shutdown timeout, uvicorn cancels what is left


def log_plugins() -> None:
    records = get_plugin_host().records
    loaded = [r.name for r in records if r.loaded]
    logger.info("plugins loaded: %s", ", ".join(loaded) or "none")
    for record in records:
        if not record.loaded:
            logger.warning("plugin %s skipped: %s", record.name,
                           record.reason.splitlines()[0] if record.reason else "")


async def run_server(config: EngineConfig, settings: ServerSettings,
                     data_parallel_secret: bytes | None = None) -> None:
    starting = asyncio.ensure_future(AsyncLLM.start(config, data_parallel_secret))
    await asyncio.sleep(0)  # runs start() until it has spawned the core and awaits it
    log_plugins()
    # The engine core loads the model in its own process meanwhile (on another core):
    # the web stack and the tokenizer's modules are imported now, off the critical path.
    import octavo.engine.llm_engine  # noqa: F401  (the handshake's tokenizer, the Processor)

    # xgrammar's extension modules take ~1 s to load, all of it holding the GIL: loaded by
    # the first structured request instead, they stalled every request and /health as long.
    import octavo.structured.grammar  # noqa: F401
    from octavo.entrypoints.openai.app import build_app
    from octavo.entrypoints.openai.chat_template import check_start_template
    from octavo.entrypoints.openai.lora_routes import serve_lora_modules
    from octavo.entrypoints.openai.stall import StallMonitor
    from octavo.entrypoints.openai.supervisor import DrainingServer, supervise

    engine = await starting
    if not config.observability.disable_log_stats:
        engine.stat_loggers.append(LoggingStatLogger(config.observability.log_stats_interval))
    try:
        check_start_template(engine.tokenizer, settings.chat_template)
        serve_lora_modules(engine, settings)
        ready = engine.ready
        logger.info("engine core process pid %d: platform %s, model %s, %d KV blocks of %d "
                    "tokens, max_model_len %d", ready.pid, ready.platform, ready.model,
                    ready.num_blocks, ready.block_size, ready.max_model_len)
        logger.info("serving %r at http://%s:%d%s", settings.served_model_name, settings.host,
                    settings.port, " (API key required)" if settings.api_key else "")
        if not settings.disable_playground:
            logger.info("playground: http://%s:%d/", settings.host, settings.port)
        server = DrainingServer(uvicorn_config(build_app(engine, settings), settings),
                                engine, settings.shutdown_timeout_s)
        freeze_startup_heap()
        engine.stall_watch.timeout_s = settings.engine_stall_timeout or None
        stalls = StallMonitor(engine, fail_requests=settings.engine_stall_action == "fail")
        watcher = asyncio.ensure_future(supervise(engine, server, settings.restart_engine,
                                                  stalls))
        try:
            await server.serve()
        finally:
            died = watcher.done() and not watcher.cancelled()
            watcher.cancel()  # before the engine stops: no restart may start after that
    finally:
        engine.shutdown()  # already done by the app's shutdown unless uvicorn failed
    if died:
        watcher.result()  # raises the EngineDeadError: octavo serve exits non-zero


def uvicorn_config(app: Any, settings: ServerSettings) -> Any:
    """uvicorn's config for ``app`` with the per-client limits of ``settings``."""
    import uvicorn

    from octavo.entrypoints.openai.body_budget import BodyBudget, default_inflight_body_size
    from octavo.entrypoints.openai.body_limit import BodyLimit
    from octavo.entrypoints.openai.http_guard import (
        MAX_HEAD_BYTES,
        ConnectionLimits,
        default_max_connections,
        protocol_class,
    )

    limits = ConnectionLimits(settings.max_connections or default_max_connections(),
                              settings.header_timeout_s)
    budget = BodyBudget(settings.max_inflight_body_size
                        or default_inflight_body_size(settings.max_request_body_size))
    return uvicorn.Config(
        BodyLimit(app, settings.max_request_body_size, settings.body_timeout_s, budget,
                  settings.retry_after_s),
        host=settings.host, port=settings.port, log_level="info",
        http=protocol_class(limits), h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        # the backstop: the supervisor ends running requests at shutdown_timeout_s
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s) + GRACE_BACKSTOP_S)
