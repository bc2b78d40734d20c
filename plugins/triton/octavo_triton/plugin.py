"""Entry point of octavo-triton: registers the Triton attention backend. The kernels
register no platform of their own: the CUDA and ROCm plugins build on them."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.4,<2"  # 1.4: num_kv_blocks, MLAImpl and MLADims (latent attention)


@hookimpl
def octavo_register_attention_backends(registry: Registry[Any]) -> None:
    from octavo_triton.backend import TritonAttentionBackend

    registry.register(TritonAttentionBackend.name, TritonAttentionBackend)
