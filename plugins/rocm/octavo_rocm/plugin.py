"""Entry point of octavo-rocm: registers the ROCm platform."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_rocm.platform import RocmPlatform

    registry.register(RocmPlatform.name, RocmPlatform)
