"""Entry point of octavo-neuron: registers the Neuron platform and its NKI attention
backend."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.2,<2"  # 1.2: CpuPlatform


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_neuron.platform import NeuronPlatform

    registry.register(NeuronPlatform.name, NeuronPlatform)


@hookimpl
def octavo_register_attention_backends(registry: Registry[Any]) -> None:
    from octavo_neuron.backend import NkiAttentionBackend

    registry.register(NkiAttentionBackend.name, NkiAttentionBackend)
