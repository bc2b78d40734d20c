"""The CUDA platform's availability check, here on a machine without an NVIDIA GPU."""

import pytest
import torch

from octavo_cuda.platform import CudaPlatform

from ..helpers import assert_backend_unavailable


def test_unavailable_with_reason() -> None:
    availability = CudaPlatform.check_available()
    assert availability.available == (torch.cuda.is_available() and torch.version.hip is None)
    if torch.version.cuda is None:
        assert "CPU-only build (torch.version.cuda is None)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has the hardware")
    assert_backend_unavailable("cuda", "torch.version.cuda is None")
