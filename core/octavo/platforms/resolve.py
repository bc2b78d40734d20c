"""Turning ``--backend NAME`` into a platform class, with errors that say what to do."""

from __future__ import annotations

from octavo.platforms.base import Platform
from octavo.plugins import Registry, get_registries

# Backends whose plugin distributions the project ships; used to say what to install.
KNOWN_BACKEND_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "cuda": ("octavo-triton", "octavo-cuda"),
    "rocm": ("octavo-triton", "octavo-rocm"),
    "tpu": ("octavo-tpu",),
    "neuron": ("octavo-neuron",),
}
BACKEND_CHOICES = ("auto", "cpu", "cuda", "rocm", "tpu", "neuron")


class BackendError(RuntimeError):
    """The requested backend cannot be used; the message says why and what to do."""


def _install_hint(name: str) -> str:
    dists = KNOWN_BACKEND_DISTRIBUTIONS[name]
    paths = " ".join(f"./plugins/{d.removeprefix('octavo-').replace('-', '_')}" for d in dists)
    return (
        f"the {name!r} backend is provided by the {dists[-1]} distribution, which is not "
        f"installed (or was filtered out by OCTAVO_PLUGINS). Install it with: "
        f"pip install 'octavo[{name}]' (from a checkout: pip install {paths})"
    )


def resolve_platform(name: str, registry: Registry[type[Platform]] | None = None) -> type[Platform]:
    """The platform class for ``name`` (or the best available one for ``"auto"``)."""
    registry = get_registries().platforms if registry is None else registry
    if name == "auto":
        return _best_available(registry)
    if name not in registry:
        if name in KNOWN_BACKEND_DISTRIBUTIONS:
            raise BackendError(_install_hint(name))
        raise BackendError(f"unknown backend {name!r}; installed backends: auto, "
                           + ", ".join(registry.names()))
    platform = registry.get(name)
    availability = platform.check_available()
    if not availability.available:
        raise BackendError(f"the {name!r} backend is installed but cannot run here: "
                           f"{availability.reason}")
    if platform.missing_kernels:
        raise BackendError(f"the {name!r} backend found its hardware but cannot run models yet: "
                           f"{platform.missing_kernels}")
    return platform


def _best_available(registry: Registry[type[Platform]]) -> type[Platform]:
    ready = [p for p in registry.entries()
             if not p.obj.missing_kernels and p.obj.check_available().available]
    if not ready:
        raise BackendError("no backend is available here (not even cpu)")
    return max(ready, key=lambda e: e.obj.priority).obj
