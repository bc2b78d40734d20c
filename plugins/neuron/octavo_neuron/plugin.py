"""Entry point of octavo-neuron: registers the Neuron platform."""

from __future__ import annotations

from typing import Any

from octavo.plugins import Registry, hookimpl


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo_neuron.platform import NeuronPlatform

    registry.register(NeuronPlatform.name, NeuronPlatform)
