"""Backend resolution for CLI commands: a clean exit 2 when the backend cannot be used."""

from __future__ import annotations

import click

from octavo.platforms import Platform
from octavo.plugins.resolve import BackendError, resolve_platform


class BackendUnusable(click.ClickException):
    """Exit code 2: the command line asked for something this machine cannot provide."""

    exit_code = 2


def resolve_backend_or_exit(name: str) -> type[Platform]:
    try:
        return resolve_platform(name)
    except BackendError as exc:
        raise BackendUnusable(str(exc)) from None
