"""Entry point of octavo-triton: registers the Triton attention backend. The kernels
register no platform of their own: the CUDA and ROCm plugins build on them."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_attention_backends(registry: Registry[Any]) -> None:
    from octavo_triton.backend import TritonAttentionBackend

    registry.register(TritonAttentionBackend.name, TritonAttentionBackend)
