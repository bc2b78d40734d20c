"""The Neuron platform's availability check, here on a machine without Neuron devices."""

import glob

from octavo_neuron.platform import NeuronPlatform

from ..helpers import assert_backend_unavailable


def test_unavailable_with_reason() -> None:
    assert not glob.glob("/dev/neuron*"), "this test expects a machine without Neuron devices"
    availability = NeuronPlatform.check_available()
    assert not availability.available
    assert "no Neuron devices (looked for /dev/neuron*)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    assert_backend_unavailable("neuron", "looked for /dev/neuron*")
