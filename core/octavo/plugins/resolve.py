"""From the names a config holds to the classes that run: ``--backend NAME`` to a platform,
and every other name (attention backend, scheduler, KV manager, policy, connector,
proposer) to its registered class, when the engine is built.

Each failure says what to do: a ``PlatformError`` names what to install or what was not
found; a ``ConfigError`` names the setting and lists the registered names. ``check_names``
runs every check before any model is loaded, so a typo costs no load time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from octavo.config import EngineConfig
from octavo.config.errors import ConfigError
from octavo.platforms.base import Platform
from octavo.plugins.manager import Registries
from octavo.plugins.registry import Registry
from octavo.qualname import resolve_qualname

if TYPE_CHECKING:
    from octavo.attention.base import AttentionBackend
    from octavo.kv.interface import KVCacheManagerInterface
    from octavo.kv_transfer.base import KVConnector
    from octavo.sched.interface import SchedulerInterface
    from octavo.worker.spec_decode.proposer import Proposer

T = TypeVar("T")

# Platforms whose plugin distributions the project ships; used to say what to install.
KNOWN_PLATFORM_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "cuda": ("octavo-triton", "octavo-cuda"),
    "rocm": ("octavo-triton", "octavo-rocm"),
    "tpu": ("octavo-tpu",),
    "neuron": ("octavo-neuron",),
}


class PlatformError(RuntimeError):
    """The requested platform (``--backend``) cannot be used; the message says why and what
    to do."""


def _install_hint(name: str) -> str:
    dists = KNOWN_PLATFORM_DISTRIBUTIONS[name]
    paths = " ".join(f"./plugins/{d.removeprefix('octavo-').replace('-', '_')}" for d in dists)
    return (
        f"the {name!r} backend is provided by the {dists[-1]} distribution, which is not "
        f"installed (or was filtered out by OCTAVO_PLUGINS). Install it with: "
        f"pip install 'octavo[{name}]' (from a checkout: pip install {paths})"
    )


def resolve_platform(name: str, registry: Registry[type[Platform]] | None = None,
                     ) -> type[Platform]:
    """The platform class for ``name`` (or the best available one for ``"auto"``), from
    this process's registry unless one is given."""
    if registry is None:
        from octavo.plugins import get_registries

        registry = get_registries().platforms
    if name == "auto":
        return _best_available(registry)
    if name not in registry:
        if name in KNOWN_PLATFORM_DISTRIBUTIONS:
            raise PlatformError(_install_hint(name))
        raise PlatformError(f"unknown backend {name!r}; installed backends: auto, "
                           + ", ".join(registry.names()))
    platform = registry.get(name)
    availability = platform.check_available()
    if not availability.available:
        raise PlatformError(f"the {name!r} backend is installed but cannot run here: "
                           f"{availability.reason}")
    if platform.missing_kernels:
        raise PlatformError(f"the {name!r} backend found its hardware but cannot run models yet: "
                           f"{platform.missing_kernels}")
    return platform


def _best_available(registry: Registry[type[Platform]]) -> type[Platform]:
    ready = [p for p in registry.entries()
             if not p.obj.missing_kernels and p.obj.check_available().available]
    if not ready:
        raise PlatformError("no backend is available here (not even cpu)")
    return max(ready, key=lambda e: e.obj.priority).obj


def lookup(registry: Registry[T], name: str, setting: str) -> T:
    """``registry``'s entry for ``name``; a ``ConfigError`` naming ``setting`` and listing the
    registered names when there is none."""
    if name in registry:
        return registry.get(name)
    known = ", ".join(registry.names()) or "none"
    raise ConfigError(f"{setting}: unknown {registry.kind} {name!r}; registered: {known}")


def lookup_class(registry: Registry[type[T]], name: str, setting: str) -> type[T]:
    """Like :func:`lookup`, and a dotted ``package.module.Class`` not in the registry is
    imported (vLLM's ``--scheduler-cls`` takes a qualified name)."""
    if name not in registry and "." in name:
        try:
            return resolve_qualname(name)  # type: ignore[no-any-return]
        except ImportError as exc:
            raise ConfigError(f"{setting}: cannot import {name!r}: {exc}") from None
    return lookup(registry, name, setting)


def check_names(config: EngineConfig, registries: Registries,
                platform: type[Platform] | None = None) -> None:
    """Every name in ``config`` is registered (the attention backend too when the platform
    is known); raises ``ConfigError`` at the first that is not. Cheap: no class is built."""
    if platform is not None:
        check_kv_cache_dtype(config, platform, attention_backend(config, platform, registries))
    elif config.device.attention_backend is not None:
        lookup(registries.attention_backends, config.device.attention_backend,
               "attention_backend")
    scheduler_cls(config, registries)
    kv_manager_cls(config, registries)
    lookup(registries.scheduling_policies, config.scheduler.scheduling_policy,
           "scheduling_policy")
    kv_connector_cls(config, registries)
    proposer_cls(config, registries)


def attention_backend(config: EngineConfig, platform: type[Platform],
                      registries: Registries) -> type[AttentionBackend]:
    name = config.device.attention_backend or platform.attention_backend
    return lookup(registries.attention_backends, name, "attention_backend")


def check_kv_cache_dtype(config: EngineConfig, platform: type[Platform],
                         backend: type[AttentionBackend]) -> None:
    """A ``ConfigError`` naming ``--kv-cache-dtype`` when the platform's worker or the
    attention backend cannot store the cache in that dtype: refused at start, never in a
    step."""
    value = config.cache.kv_cache_dtype
    for what, supported in ((f"the {platform.name!r} backend", platform.kv_cache_dtypes),
                            (f"the {backend.name!r} attention backend",
                             backend.supported_kv_cache_dtypes)):
        if value not in supported:
            raise ConfigError(f"--kv-cache-dtype {value}: {what} stores the KV cache only as "
                              f"{', '.join(supported)}")


def scheduler_cls(config: EngineConfig, registries: Registries) -> type[SchedulerInterface]:
    return lookup_class(registries.schedulers, config.scheduler.scheduler_cls, "scheduler_cls")


def kv_manager_cls(config: EngineConfig, registries: Registries,
                   ) -> type[KVCacheManagerInterface]:
    return lookup_class(registries.kv_managers, config.scheduler.kv_manager, "kv_manager")


def kv_connector_cls(config: EngineConfig, registries: Registries,
                     ) -> type[KVConnector] | None:
    """The connector ``kv_transfer_config`` names; None without one."""
    if config.kv_transfer is None:
        return None
    return lookup(registries.kv_connectors, config.kv_transfer.connector, "kv_transfer_config")


def proposer_cls(config: EngineConfig, registries: Registries) -> type[Proposer] | None:
    """The proposer ``speculative_config`` names, checked to have the model it needs; None
    without speculative decoding."""
    speculative = config.speculative
    if speculative is None:
        return None
    proposer = lookup(registries.proposers, speculative.method, "speculative_config: method")
    if proposer.requires_model and not speculative.model:
        raise ConfigError(f"speculative_config: method {speculative.method!r} needs "
                          "\"model\" (a folder)")
    return proposer
