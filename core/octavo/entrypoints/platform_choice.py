"""``--backend NAME`` to a platform for CLI commands: a clean exit 2 when it cannot be used.

In Octavo's code "platform" is the hardware kind (``Platform``: cpu, cuda, rocm, tpu,
neuron) and "attention backend" the attention kernels; the user-facing flag and keyword keep
the name ``--backend`` / ``backend=``, which chooses the platform."""

from __future__ import annotations

import click

from octavo.platforms import Platform
from octavo.plugins.resolve import PlatformError, resolve_platform


class PlatformUnusable(click.ClickException):
    """Exit code 2: the command line asked for something this machine cannot provide."""

    exit_code = 2


def resolve_platform_or_exit(name: str) -> type[Platform]:
    try:
        return resolve_platform(name)
    except PlatformError as exc:
        raise PlatformUnusable(str(exc)) from None
