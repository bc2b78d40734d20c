"""Entry point of octavo-tpu: registers the TPU platform."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.4,<2"  # 1.4: validate_request, InputBatch.apply, KV budget


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_tpu.platform import TpuPlatform

    registry.register(TpuPlatform.name, TpuPlatform)
