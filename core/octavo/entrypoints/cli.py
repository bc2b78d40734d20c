"""The ``octavo`` command line (click): one module per command, gathered here."""

from __future__ import annotations

import click

from octavo.entrypoints.bench_cmd import bench
from octavo.entrypoints.generate_cmd import chat, generate
from octavo.entrypoints.plugins_cmd import plugins_command
from octavo.entrypoints.proxy_cmd import proxy
from octavo.entrypoints.serve_cmd import serve
from octavo.plugins import get_registries
from octavo.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="octavo")
def main() -> None:
    """Octavo: serve and run LLMs on any hardware through plugins."""


for command in (plugins_command, serve, generate, chat, bench, proxy):
    main.add_command(command)
for entry in get_registries().cli_commands.entries():  # plugins' commands (octavo spec)
    main.add_command(entry.obj, entry.name)
