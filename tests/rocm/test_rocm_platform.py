"""The ROCm platform's availability check, here on a machine without an AMD GPU."""

import pytest
import torch

from octavo_rocm.platform import RocmPlatform

from ..helpers import assert_backend_unavailable


def test_unavailable_with_reason() -> None:
    availability = RocmPlatform.check_available()
    assert availability.available == (torch.version.hip is not None and torch.cuda.is_available())
    if torch.version.hip is None:
        assert "not a HIP build (torch.version.hip is None)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    if torch.version.hip is not None:
        pytest.skip("this machine has the hardware")
    assert_backend_unavailable("rocm", "torch.version.hip is None")
