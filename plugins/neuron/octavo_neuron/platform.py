"""The Neuron platform: AWS Trainium/Inferentia devices with the Neuron runtime.

Only emulation runs models in this release: with ``OCTAVO_NEURON_EMULATE=1`` in the
environment (read once, at import, as the device type must be fixed before a worker
builds its model) the platform is available on any machine and runs the NKI kernels
(``octavo_neuron.kernels``) in the numpy emulator on the CPU, in fp32 - to check that the
kernels and the ``nki`` attention backend give the engine's answers, not for speed.
``--backend auto`` never picks it then (its priority is below the CPU's). Without the
variable the platform looks for devices and a runtime; where it finds devices it still
refuses, since the torch-neuronx device path (a worker that compiles the graphs) is not
built yet.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from typing import TYPE_CHECKING

from octavo.plugin_api import Availability, CpuPlatform, Platform

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger("octavo.neuron")  # under the core's logger: shown on stderr

DEVICE_GLOB = "/dev/neuron*"
RUNTIME_GLOBS = ("/opt/aws/neuron/lib/libnrt.so*", "/usr/lib/libnrt.so*")
RUNTIME_MODULES = ("torch_neuronx", "neuronxcc")
EMULATE_ENV = "OCTAVO_NEURON_EMULATE"
EMULATE = os.environ.get(EMULATE_ENV) == "1"
EMULATION_REASON = (f"no Neuron device: NKI kernels run in the numpy emulator on the CPU "
                    f"({EMULATE_ENV}=1); for correctness, not speed")


def _runtime_found() -> str:
    """Where the Neuron runtime was found, or "" when it was not."""
    for pattern in RUNTIME_GLOBS:
        hits = glob.glob(pattern)
        if hits:
            return hits[0]
    for module in RUNTIME_MODULES:
        if importlib.util.find_spec(module) is not None:
            return f"python module {module}"
    return ""


def availability(devices: list[str], runtime: str, emulate: bool) -> Availability:
    """The verdict for what was found: emulation when asked for, else the devices - which
    are never claimed usable, as no device path exists yet."""
    if emulate:  # the devices, if any, stay unused: there is no device path to use them
        unused = f"{len(devices)} Neuron devices unused" if devices else "no Neuron device"
        return Availability.yes(EMULATION_REASON.replace("no Neuron device", unused, 1))
    if not devices:
        where = f"runtime found at {runtime}" if runtime else "no Neuron runtime either"
        return Availability.no(f"no Neuron devices (looked for {DEVICE_GLOB}); {where}")
    if not runtime:
        return Availability.no(
            f"{len(devices)} Neuron devices but no Neuron runtime (looked for "
            f"{', '.join(RUNTIME_GLOBS)} and python modules {', '.join(RUNTIME_MODULES)})")
    return Availability.no(
        f"{len(devices)} Neuron devices, runtime at {runtime}, but the Neuron device path "
        f"(a torch-neuronx worker) is not built yet in this release; {EMULATE_ENV}=1 runs "
        "the NKI kernels in the emulator on the CPU instead")


class NeuronPlatform(Platform):
    name = "neuron"
    device_type = "cpu" if EMULATE else "neuron"
    priority = -10 if EMULATE else 70  # emulation is for tests: auto keeps the CPU
    dist_backend = "gloo" if EMULATE else "xla"
    default_dtype = "float32" if EMULATE else "bfloat16"
    attention_backend = "nki"
    worker_cls = "octavo_neuron.worker.NeuronWorker"
    distribution = "octavo-neuron"

    @classmethod
    def check_available(cls) -> Availability:
        return availability(sorted(glob.glob(DEVICE_GLOB)), _runtime_found(), EMULATE)

    @classmethod
    def total_memory(cls) -> int:
        if not EMULATE:
            raise RuntimeError(_NO_MEMORY_QUERY)
        return CpuPlatform.total_memory()  # emulation runs in RAM

    @classmethod
    def free_memory(cls) -> int:
        if not EMULATE:
            raise RuntimeError(_NO_MEMORY_QUERY)
        return CpuPlatform.free_memory()

    @classmethod
    def prepare_model(cls, model: nn.Module, dtype: torch.dtype) -> int:
        """Switch the model's norm, rotary and activation layers onto the NKI kernels."""
        from octavo_neuron.layers import use_nki_layers

        del dtype  # the kernels take the model's dtype from their inputs
        switched = use_nki_layers(model)
        logger.info("neuron: %d layers on NKI kernels", switched)
        return switched


# Device memory comes with the device worker, which does not exist yet (emulation uses RAM).
_NO_MEMORY_QUERY = ("Neuron device memory is not queried yet: it comes with the Neuron device "
                    f"worker, which is not built in this release ({EMULATE_ENV}=1 emulates)")
