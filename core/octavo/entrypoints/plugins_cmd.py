"""``octavo plugins``: what is installed, what loaded, what it provides."""

from __future__ import annotations

import click

from octavo.entrypoints.table import format_table
from octavo.plugins import get_plugin_host, get_registries


def _platform_cells(plugin: str) -> list[str]:
    """'name: yes/no (reason)' for each platform the plugin registered."""
    cells = []
    for entry in get_registries().platforms.entries():
        if entry.plugin != plugin:
            continue
        availability = entry.obj.check_available()
        verdict = "yes" if availability.available else "no"
        note = availability.reason
        if availability.available and entry.obj.missing_kernels:
            verdict, note = "no", entry.obj.missing_kernels
        cells.append(f"{entry.name}: {verdict} ({note})")
    return cells


@click.command("plugins")
def plugins_command() -> None:
    """List installed Octavo plugins: distribution, hooks provided, platforms and their
    availability here, and why any plugin was skipped."""
    registries = get_registries()  # fills registries, which may mark failing plugins skipped
    del registries
    rows = []
    for record in get_plugin_host().records:
        hooks = ", ".join(h.removeprefix("octavo_register_") for h in record.hooks) or "(none)"
        status = "loaded" if record.loaded else f"skipped: {record.reason.splitlines()[0]}"
        platforms = _platform_cells(record.name) if record.loaded else []
        rows.append([record.name, f"{record.distribution} {record.version}", hooks, status,
                     "; ".join(platforms) or "-"])
    click.echo(format_table(["PLUGIN", "DISTRIBUTION", "HOOKS", "STATUS", "PLATFORMS"], rows))
