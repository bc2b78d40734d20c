"""Discovering, vetting and loading plugins, and filling the registries from their hooks.

Plugins are entry points in the group ``octavo``. Before a plugin module is imported its
distribution's declared requirement on ``octavo`` is checked against this core's version;
``OCTAVO_PLUGINS=a,b`` keeps only the named entry points. A plugin that fails any step
(version range, import, a hook that raises) is recorded with the reason and skipped: the
core and the other plugins keep working.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from importlib.metadata import Distribution, EntryPoint, entry_points
from types import ModuleType
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from octavo.plugins import hookspecs
from octavo.plugins.registry import Registry
from octavo.version import __version__

ENTRY_POINT_GROUP = "octavo"
BUILTIN_PLUGIN = "octavo"
BUILTIN_MODULE = "octavo.plugins.builtin"

# Registry attribute name -> hook that fills it.
REGISTRY_HOOKS: dict[str, str] = {
    "platforms": "octavo_register_platforms",
    "attention_backends": "octavo_register_attention_backends",
    "kv_connectors": "octavo_register_kv_connectors",
    "proposers": "octavo_register_proposers",
    "schedulers": "octavo_register_schedulers",
    "scheduling_policies": "octavo_register_scheduling_policies",
    "kv_managers": "octavo_register_kv_managers",
    "models": "octavo_register_models",
    "cli_commands": "octavo_register_cli_commands",
}


@dataclass
class PluginRecord:
    """What ``octavo plugins`` shows about one plugin."""

    name: str
    distribution: str
    version: str
    module: str
    loaded: bool = False
    reason: str = ""
    hooks: list[str] = field(default_factory=list)


@dataclass
class Registries:
    """All named registries, filled once per process from every loaded plugin."""

    platforms: Registry[Any] = field(default_factory=lambda: Registry("platform"))
    attention_backends: Registry[Any] = field(
        default_factory=lambda: Registry("attention backend")
    )
    kv_connectors: Registry[Any] = field(default_factory=lambda: Registry("KV connector"))
    proposers: Registry[Any] = field(default_factory=lambda: Registry("proposer"))
    schedulers: Registry[Any] = field(default_factory=lambda: Registry("scheduler"))
    scheduling_policies: Registry[Any] = field(
        default_factory=lambda: Registry("scheduling policy")
    )
    kv_managers: Registry[Any] = field(default_factory=lambda: Registry("KV manager"))
    models: Registry[Any] = field(default_factory=lambda: Registry("model architecture"))
    cli_commands: Registry[Any] = field(default_factory=lambda: Registry("CLI command"))


def core_version_problem(dist: Distribution | None, core_version: str = __version__) -> str:
    """Return why ``dist`` cannot run on this core, or ``""`` when its declared range admits it."""
    if dist is None:
        return ""
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() != "octavo" or req.marker is not None and "extra" in str(req.marker):
            continue
        if not req.specifier.contains(Version(core_version), prereleases=True):
            return (
                f"requires octavo{req.specifier} but this core is octavo {core_version}; "
                f"install a matching version of {dist.metadata['Name']} or of octavo"
            )
    return ""


def _selected(env_value: str | None) -> set[str] | None:
    if not env_value:
        return None
    return {name.strip() for name in env_value.split(",") if name.strip()}


class PluginHost:
    """One pluggy ``PluginManager("octavo")`` with the built-ins and the entry-point plugins."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self._register_builtins()
        self._load_entry_points(_selected(env.get("OCTAVO_PLUGINS")))
        self.pm.check_pending()

    def _register_builtins(self) -> None:
        module = importlib.import_module(BUILTIN_MODULE)
        self.pm.register(module, name=BUILTIN_PLUGIN)
        self.records.append(
            PluginRecord(BUILTIN_PLUGIN, "octavo", __version__, BUILTIN_MODULE, loaded=True,
                         hooks=self._hook_names(module))
        )

    def _load_entry_points(self, selected: set[str] | None) -> None:
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            record = self._record_for(ep)
            self.records.append(record)
            if selected is not None and ep.name not in selected:
                record.reason = "not selected by OCTAVO_PLUGINS"
                continue
            record.reason = core_version_problem(ep.dist)
            if record.reason:
                continue
            self._import_and_register(ep, record)

    @staticmethod
    def _record_for(ep: EntryPoint) -> PluginRecord:
        dist = ep.dist
        return PluginRecord(
            name=ep.name,
            distribution=dist.metadata["Name"] if dist else "?",
            version=dist.version if dist else "?",
            module=ep.value,
        )

    def _import_and_register(self, ep: EntryPoint, record: PluginRecord) -> None:
        try:
            module = ep.load()
        except Exception as exc:  # any import-time failure isolates only this plugin
            record.reason = f"failed to import {ep.value}: {type(exc).__name__}: {exc}"
            return
        if self.pm.has_plugin(ep.name):
            record.reason = f"another plugin is already registered as {ep.name!r}"
            return
        try:
            self.pm.register(module, name=ep.name)
        except pluggy.PluginValidationError as exc:
            record.reason = f"invalid hook implementation: {exc}"
            return
        record.loaded = True
        record.hooks = self._hook_names(module)

    def _hook_names(self, plugin: ModuleType) -> list[str]:
        return sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])

    def fill(self, registries: Registries) -> None:
        """Call each loaded plugin's registration hooks, one plugin at a time.

        A plugin whose hook raises is rolled back - nothing it registered stays - and
        recorded as skipped, so one bad plugin cannot break the core or the others.
        """
        for record in self.records:
            if not record.loaded:
                continue
            plugin = self.pm.get_plugin(record.name)
            snapshot = {attr: getattr(registries, attr).snapshot() for attr in REGISTRY_HOOKS}
            try:
                self._call_hooks(plugin, record.name, registries)
            except Exception as exc:
                for attr, saved in snapshot.items():
                    getattr(registries, attr).restore(saved)
                record.loaded = False
                record.reason = f"a registration hook raised {type(exc).__name__}: {exc}"

    def _call_hooks(self, plugin: object, name: str, registries: Registries) -> None:
        for attr, hook_name in REGISTRY_HOOKS.items():
            function = getattr(plugin, hook_name, None)
            if function is None:
                continue
            registry: Registry[Any] = getattr(registries, attr)
            registry.current_plugin = name
            try:
                function(registry=registry)
            finally:
                registry.current_plugin = "<unknown>"

    def record(self, plugin: str) -> PluginRecord:
        for record in self.records:
            if record.name == plugin:
                return record
        raise KeyError(plugin)
