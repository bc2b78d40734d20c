"""Octavo's plugin system: pluggy hooks, entry-point discovery and named registries.

``get_registries()`` is what the rest of the core calls: it loads the plugins of this
process once and returns the filled registries.
"""

from __future__ import annotations

from functools import lru_cache

from octavo.plugins.hookspecs import hookimpl, hookspec
from octavo.plugins.manager import PluginHost, PluginRecord, Registries
from octavo.plugins.registry import Registry, RegistryError

__all__ = [
    "PluginHost",
    "PluginRecord",
    "Registries",
    "Registry",
    "RegistryError",
    "get_plugin_host",
    "get_registries",
    "hookimpl",
    "hookspec",
]


@lru_cache(maxsize=1)
def get_plugin_host() -> PluginHost:
    """The process-wide plugin host (plugins load on first use)."""
    return PluginHost()


@lru_cache(maxsize=1)
def get_registries() -> Registries:
    """The process-wide registries, filled from every loaded plugin's hooks."""
    registries = Registries()
    get_plugin_host().fill(registries)
    return registries
