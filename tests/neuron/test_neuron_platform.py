"""The Neuron platform's availability: here on a machine without Neuron devices, and the
verdicts for what another machine may have (emulation asked for, devices without a device
path)."""

import glob

from octavo_neuron.platform import EMULATE, EMULATION_REASON, NeuronPlatform, availability

from ..helpers import assert_backend_unavailable, run_octavo


def test_unavailable_with_reason() -> None:
    assert not glob.glob("/dev/neuron*"), "this test expects a machine without Neuron devices"
    assert not EMULATE, "this test expects OCTAVO_NEURON_EMULATE unset"
    availability = NeuronPlatform.check_available()
    assert not availability.available
    assert "no Neuron devices (looked for /dev/neuron*)" in availability.reason


def test_cli_says_what_was_not_found() -> None:
    assert_backend_unavailable("neuron", "looked for /dev/neuron*")


def test_emulation_is_available_and_says_so() -> None:
    verdict = availability([], "", emulate=True)
    assert verdict.available and verdict.reason == EMULATION_REASON
    with_devices = availability(["/dev/neuron0"], "", emulate=True)
    assert with_devices.available
    assert with_devices.reason.startswith("1 Neuron devices unused: NKI kernels run in the")
    assert "numpy emulator on the CPU (OCTAVO_NEURON_EMULATE=1)" in EMULATION_REASON
    assert "for correctness, not speed" in EMULATION_REASON


def test_devices_are_never_claimed_without_a_device_path() -> None:
    verdict = availability(["/dev/neuron0", "/dev/neuron1"], "/opt/aws/neuron/lib/libnrt.so",
                           emulate=False)
    assert not verdict.available
    assert "2 Neuron devices" in verdict.reason
    assert "device path (a torch-neuronx worker) is not built yet" in verdict.reason


def test_plugins_command_shows_the_verdict() -> None:
    result = run_octavo("plugins")
    assert result.returncode == 0, result.stderr
    assert "neuron: no (no Neuron devices (looked for /dev/neuron*)" in result.stdout
