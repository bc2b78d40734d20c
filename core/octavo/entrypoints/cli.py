"""The ``octavo`` command line (click)."""

from __future__ import annotations

import click

from octavo.entrypoints.plugins_cmd import plugins_command
from octavo.platforms import BACKEND_CHOICES, BackendError, Platform, resolve_platform
from octavo.version import __version__

MODEL_HELP = "HF folder or .gguf file (default: SmolLM2-135M-Instruct)."
BACKEND_HELP = (
    "Hardware backend: " + "|".join(BACKEND_CHOICES) + " or a plugin's own name. "
    "'auto' picks the best available one."
)


class BackendUnusable(click.ClickException):
    """Exit code 2: the command line asked for something this machine cannot provide."""

    exit_code = 2


def resolve_backend_or_exit(name: str) -> type[Platform]:
    try:
        return resolve_platform(name)
    except BackendError as exc:
        raise BackendUnusable(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="octavo")
def main() -> None:
    """Octavo: serve and run LLMs on any hardware through plugins."""


main.add_command(plugins_command)


@main.command()
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--backend", default="auto", show_default=True, help=BACKEND_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
def serve(model: str | None, backend: str, host: str, port: int) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    platform = resolve_backend_or_exit(backend)
    raise click.ClickException(
        f"backend {platform.name!r} resolved, but the serving engine is not built yet"
    )


@main.command()
@click.argument("prompt")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--backend", default="auto", show_default=True, help=BACKEND_HELP)
def generate(prompt: str, model: str | None, backend: str) -> None:
    """Generate a completion of PROMPT and print it."""
    platform = resolve_backend_or_exit(backend)
    raise click.ClickException(
        f"backend {platform.name!r} resolved, but the generation engine is not built yet"
    )


@main.group()
def bench() -> None:
    """Benchmarks: latency, throughput, online serving, auto-tuning."""
