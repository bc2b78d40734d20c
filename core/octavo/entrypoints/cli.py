"""The ``octavo`` command line (click)."""

from __future__ import annotations

from typing import Any

import click

from octavo.entrypoints.backend import resolve_backend_or_exit
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.entrypoints.generate_cmd import chat, generate
from octavo.entrypoints.plugins_cmd import plugins_command
from octavo.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="octavo")
def main() -> None:
    """Octavo: serve and run LLMs on any hardware through plugins."""


main.add_command(plugins_command)
main.add_command(generate)
main.add_command(chat)


@main.command()
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


@main.group()
def bench() -> None:
    """Benchmarks: latency, throughput, online serving, auto-tuning."""
