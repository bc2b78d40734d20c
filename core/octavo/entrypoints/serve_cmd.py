"""``octavo serve``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

from typing import Any

import click

from octavo.entrypoints.backend import resolve_backend_or_exit
from octavo.entrypoints.engine_args import build_config, engine_options


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@engine_options
def serve(host: str, port: int, **kwargs: Any) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    config = build_config(kwargs)
    platform = resolve_backend_or_exit(config.backend)
    raise click.ClickException(
        f"backend {platform.name!r} resolved, but the HTTP server is not built yet"
    )
