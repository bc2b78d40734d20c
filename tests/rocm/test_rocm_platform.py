"""The ROCm platform's availability check, here on a machine without an AMD GPU."""

import pytest
import torch

from octavo.plugins import get_registries
from octavo.qualname import resolve_qualname
from octavo_rocm.platform import RocmPlatform

from ..helpers import assert_backend_unavailable, run_octavo


def test_unavailable_with_reason() -> None:
    availability = RocmPlatform.check_available()
    assert availability.available == (torch.version.hip is not None and torch.cuda.is_available())
    if torch.version.hip is None:
        assert "not a HIP build (torch.version.hip is None)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    if torch.version.hip is not None:
        pytest.skip("this machine has the hardware")
    assert_backend_unavailable("rocm", "torch.version.hip is None")


def test_serve_exits_2_saying_no_rocm_here() -> None:
    if torch.version.hip is not None:
        pytest.skip("this machine has the hardware")
    result = run_octavo("serve", "--backend", "rocm")
    assert result.returncode == 2, result.stderr
    assert "not a HIP build (torch.version.hip is None)" in result.stderr


def test_the_platform_names_the_triton_backend_and_the_gpu_worker() -> None:
    """The platform's names resolve (the worker itself needs an AMD GPU)."""
    from octavo_triton.backend import TritonAttentionBackend
    from octavo_triton.gpu_worker import GpuWorker

    assert RocmPlatform.missing_kernels == ""
    backends = get_registries().attention_backends
    assert backends.get(RocmPlatform.attention_backend) is TritonAttentionBackend
    assert RocmPlatform.worker_cls == "octavo_triton.gpu_worker.GpuWorker"
    assert resolve_qualname(RocmPlatform.worker_cls) is GpuWorker
