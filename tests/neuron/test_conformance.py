"""The platform conformance contract (octavo.testing) against the Neuron platform; where
its hardware is missing, the contract checks that it says so and skips the rest."""

from __future__ import annotations

from octavo.testing import PlatformContract
from octavo_neuron.platform import NeuronPlatform


class TestNeuronPlatform(PlatformContract):
    platform = NeuronPlatform
