"""``octavo serve``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from octavo.entrypoints.backend import resolve_backend_or_exit
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.entrypoints.openai.settings import DEFAULT_MODEL_NAME, ServerSettings


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")
@click.option("--api-key", envvar="OCTAVO_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on the API routes "
                   "(or set OCTAVO_API_KEY).")
@click.option("--served-model-name", default=None,
              help="The model name clients use (default: the --model path, or "
                   f"{DEFAULT_MODEL_NAME} for the default model).")
@click.option("--max-waiting-requests", type=click.IntRange(min=1), default=None,
              help="Answer 503 with Retry-After when this many accepted requests are still "
                   "waiting for their first token (default: no cap).")
@engine_options
def serve(host: str, port: int, api_key: str | None, served_model_name: str | None,
          max_waiting_requests: int | None, **kwargs: Any) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    from octavo.engine.core_proc import EngineStartError
    from octavo.entrypoints.openai.api_server import run_server

    config = build_config(kwargs)
    if config.device.backend != "auto":  # "auto" always resolves (the CPU at least); checking it
        # here would import the whole model stack before the engine core is even spawned
        resolve_backend_or_exit(config.device.backend)
    settings = ServerSettings(
        host=host, port=port, api_key=api_key,
        served_model_name=served_model_name or config.model.model or DEFAULT_MODEL_NAME,
        max_waiting_requests=max_waiting_requests)
    try:
        asyncio.run(run_server(config, settings))
    except EngineStartError as exc:
        raise click.ClickException(str(exc)) from None
