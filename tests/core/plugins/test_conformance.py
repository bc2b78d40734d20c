"""The conformance contracts (octavo.testing) against the core's own attention backends and
platform: the portable torch backend, the CPU backend in fp32 and in bf16 (where its fused C
kernels write the KV and decode, with them on and off), and the CPU platform."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from octavo.cpu import kernel_build
from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.attention import CpuAttentionBackend
from octavo.cpu.platform import CpuPlatform
from octavo.plugin_api import TorchAttentionBackend
from octavo.testing import AttentionBackendContract, PlatformContract


class TestTorchAttention(AttentionBackendContract):
    backend = TorchAttentionBackend


class TestCpuAttention(AttentionBackendContract):
    backend = CpuAttentionBackend


class TestCpuAttentionBf16(AttentionBackendContract):
    backend = CpuAttentionBackend
    dtype = torch.bfloat16
    head_dims = (64,)
    block_sizes = (16,)


class TestCpuAttentionBf16Portable(TestCpuAttentionBf16):
    """bf16 with the fused kernels off: every step on the portable path."""

    @pytest.fixture(autouse=True)
    def fused_kernels_off(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setenv(kernel_build.ENABLE_ENV, "0")
        cpu_kernels.library.cache_clear()
        yield
        monkeypatch.undo()
        cpu_kernels.library.cache_clear()


class TestCpuPlatform(PlatformContract):
    platform = CpuPlatform
    model_dtypes = ("float32", "bfloat16")
