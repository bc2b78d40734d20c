"""Entry point of octavo-tpu: registers the TPU platform."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_tpu.platform import TpuPlatform

    registry.register(TpuPlatform.name, TpuPlatform)
