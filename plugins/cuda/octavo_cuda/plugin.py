"""Entry point of octavo-cuda: registers the CUDA platform."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_cuda.platform import CudaPlatform

    registry.register(CudaPlatform.name, CudaPlatform)
