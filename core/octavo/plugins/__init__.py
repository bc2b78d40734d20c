"""Octavo's plugin system: pluggy hooks, entry-point discovery, version checks and typed
named registries, and the resolution of a config's names against them (``resolve``).

``get_registries()`` is what the engine and the entrypoints call: it loads the plugins of
this process once and returns the filled registries. Layer: above the scheduler, the worker
and the features whose interfaces the registries hold (``builtin`` registers the core's own
classes through the same hooks as any plugin); below the engine, which builds its parts from
the registries. Plugins themselves import ``octavo.plugin_api``, never this package.
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
    host = get_plugin_host()
    registries = Registries(trace=host.trace)
    host.fill(registries)
    return registries
