"""The TPU platform's availability check, here on a machine without a TPU."""

import importlib.util

from octavo_tpu.platform import TpuPlatform

from ..helpers import assert_backend_unavailable


def test_unavailable_with_reason() -> None:
    availability = TpuPlatform.check_available()
    assert not availability.available
    if importlib.util.find_spec("jax") is None:
        assert "JAX is not installed" in availability.reason
    else:
        assert "JAX sees no TPU devices" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    assert_backend_unavailable("tpu", "JAX")
