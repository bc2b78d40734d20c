"""The platform conformance contract (octavo.testing) against the TPU platform; where
its hardware is missing, the contract checks that it says so and skips the rest."""

from __future__ import annotations

from octavo.testing import PlatformContract
from octavo_tpu.platform import TpuPlatform


class TestTpuPlatform(PlatformContract):
    platform = TpuPlatform
