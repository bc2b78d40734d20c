"""Discovering, vetting and loading plugins, and filling the registries from their hooks.

Plugins are entry points in the group ``octavo``. Before a plugin module is imported, its
distribution's declared requirement on ``octavo`` is checked against this core's version
and its module's ``OCTAVO_PLUGIN_API`` range against ``PLUGIN_API_VERSION``;
``OCTAVO_PLUGINS=a,b`` keeps only the named entry points. A plugin that fails any step
(a version range, its import, a hook that raises) is recorded with the reason and skipped:
the core and the other plugins keep working.

Hooks are called through pluggy (``pm.hook``), one plugin at a time, so one plugin's
failure can be rolled back alone: each call keeps the hook wrappers other plugins
registered (they wrap each plugin's call) and goes through pluggy's tracing, which
``OCTAVO_TRACE_PLUGINS=1`` turns on, together with a line for every registration.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import Distribution, EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from octavo.plugins import hookspecs
from octavo.plugins.api_version import api_version_problem
from octavo.plugins.registry import Registry
from octavo.version import __version__

if TYPE_CHECKING:
    import click

    from octavo.attention.base import AttentionBackend
    from octavo.kv.interface import KVCacheManagerInterface
    from octavo.kv_transfer.base import KVConnector
    from octavo.models.base import CausalLM
    from octavo.platforms.base import Platform
    from octavo.sched.interface import SchedulerInterface
    from octavo.sched.policy import SchedulingPolicy
    from octavo.worker.spec_decode.proposer import Proposer

ENTRY_POINT_GROUP = "octavo"
TRACE_ENV = "OCTAVO_TRACE_PLUGINS"
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
    "tool_parsers": "octavo_register_tool_parsers",
    "reasoning_parsers": "octavo_register_reasoning_parsers",
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

    trace: bool = False
    platforms: Registry[type[Platform]] = field(init=False)
    attention_backends: Registry[type[AttentionBackend]] = field(init=False)
    kv_connectors: Registry[type[KVConnector]] = field(init=False)
    proposers: Registry[type[Proposer]] = field(init=False)
    schedulers: Registry[type[SchedulerInterface]] = field(init=False)
    scheduling_policies: Registry[type[SchedulingPolicy]] = field(init=False)
    kv_managers: Registry[type[KVCacheManagerInterface]] = field(init=False)
    models: Registry[type[CausalLM]] = field(init=False)
    cli_commands: Registry[click.Command] = field(init=False)
    # Classes of the OpenAI server's front end (``ToolParser``, ``ReasoningParser``); typed
    # loosely here, below the entrypoints layer that defines them.
    tool_parsers: Registry[type[Any]] = field(init=False)
    reasoning_parsers: Registry[type[Any]] = field(init=False)

    def __post_init__(self) -> None:
        kinds = {"platforms": "platform", "attention_backends": "attention backend",
                 "kv_connectors": "KV connector", "proposers": "proposer",
                 "schedulers": "scheduler", "scheduling_policies": "scheduling policy",
                 "kv_managers": "KV manager", "models": "model architecture",
                 "cli_commands": "CLI command", "tool_parsers": "tool-call parser",
                 "reasoning_parsers": "reasoning parser"}
        for attr, kind in kinds.items():
            setattr(self, attr, Registry(kind, trace=self.trace))

    def all(self) -> list[Registry[Any]]:
        return [getattr(self, attr) for attr in REGISTRY_HOOKS]


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
        self.trace = env.get(TRACE_ENV, "") not in ("", "0")
        if self.trace:
            self.pm.trace.root.setwriter(lambda text: print(text, end="", file=sys.stderr))
            self.pm.enable_tracing()
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
            record.reason = (core_version_problem(ep.dist)
                             or api_version_problem(ep.value.partition(":")[0]))
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

    def _hook_names(self, plugin: object) -> list[str]:
        return sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])

    def fill(self, registries: Registries) -> None:
        """Call each loaded plugin's registration hooks, one plugin at a time.

        A plugin whose hook raises is rolled back - nothing it registered stays - and
        recorded as skipped, so one bad plugin cannot break the core or the others.
        """
        for record in self.records:
            if not record.loaded:
                continue
            try:
                self._call_hooks(record.name, registries)
            except Exception as exc:
                for registry in registries.all():
                    registry.drop_plugin(record.name)
                record.loaded = False
                record.reason = f"a registration hook raised {type(exc).__name__}: {exc}"

    def _call_hooks(self, name: str, registries: Registries) -> None:
        plugin = self.pm.get_plugin(name)
        for attr, hook_name in REGISTRY_HOOKS.items():
            if hook_name not in self._hook_names(plugin):
                continue
            registry: Registry[Any] = getattr(registries, attr)
            registry.current_plugin = name
            try:
                self._caller_for(hook_name, plugin)(registry=registry)
            finally:
                registry.current_plugin = "<unknown>"

    def _caller_for(self, hook_name: str, plugin: object) -> Any:
        """``pm.hook.<hook_name>`` narrowed to ``plugin``'s implementation and every other
        plugin's hook wrappers."""
        hook = getattr(self.pm.hook, hook_name)
        others = [impl.plugin for impl in hook.get_hookimpls()
                  if impl.plugin is not plugin and not (impl.hookwrapper or impl.wrapper)]
        return self.pm.subset_hook_caller(hook_name, remove_plugins=others)

    def record(self, plugin: str) -> PluginRecord:
        for record in self.records:
            if record.name == plugin:
                return record
        raise KeyError(plugin)
