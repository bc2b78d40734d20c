"""The CUDA platform's availability check, here on a machine without an NVIDIA GPU."""

import pytest
import torch

from octavo.plugins import get_registries
from octavo.qualname import resolve_qualname
from octavo_cuda.platform import CudaPlatform

from ..helpers import assert_backend_unavailable, run_octavo

# Why this machine cannot run CUDA: a CPU-only torch, or a CUDA build of torch with no GPU
# (PyPI's torch 2.11, which tests/triton/test_older_triton.py's notes mention).
WHY_NOT = ("CPU-only build (torch.version.cuda is None)" if torch.version.cuda is None
           else "torch sees no GPU device")


def test_unavailable_with_reason() -> None:
    availability = CudaPlatform.check_available()
    assert availability.available == (torch.cuda.is_available() and torch.version.hip is None)
    if torch.version.cuda is None:
        assert "CPU-only build (torch.version.cuda is None)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has the hardware")
    assert_backend_unavailable("cuda", WHY_NOT)


def test_serve_exits_2_saying_no_cuda_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has the hardware")
    result = run_octavo("serve", "--backend", "cuda")
    assert result.returncode == 2, result.stderr
    assert "the 'cuda' backend is installed but cannot run here" in result.stderr
    assert WHY_NOT in result.stderr


def test_the_platform_names_the_triton_backend_and_the_gpu_worker() -> None:
    """The platform's names resolve: its attention backend is the registered Triton one and
    its worker class the GPU worker. (The worker itself needs a GPU; the Triton kernels run
    inside real engine steps under the interpreter in tests/triton/test_engine_interpreted.py,
    and benchmarks/gpu_check.sh runs the worker with --backend cuda where a GPU is lent.)"""
    from octavo_triton.backend import TritonAttentionBackend
    from octavo_triton.gpu_worker import GpuWorker

    assert CudaPlatform.missing_kernels == ""
    backends = get_registries().attention_backends
    assert backends.get(CudaPlatform.attention_backend) is TritonAttentionBackend
    assert CudaPlatform.worker_cls == "octavo_triton.gpu_worker.GpuWorker"
    assert resolve_qualname(CudaPlatform.worker_cls) is GpuWorker
