"""The Neuron platform: AWS Trainium/Inferentia devices with the Neuron runtime."""

from __future__ import annotations

import glob
import importlib.util

from octavo.plugin_api import Availability, Platform

DEVICE_GLOB = "/dev/neuron*"
RUNTIME_GLOBS = ("/opt/aws/neuron/lib/libnrt.so*", "/usr/lib/libnrt.so*")
RUNTIME_MODULES = ("torch_neuronx", "neuronxcc")


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


class NeuronPlatform(Platform):
    name = "neuron"
    device_type = "neuron"
    priority = 70
    dist_backend = "xla"
    default_dtype = "bfloat16"
    attention_backend = "nki"
    distribution = "octavo-neuron"
    missing_kernels = (
        "the NKI attention kernels and Neuron model runner are not implemented yet in this "
        "release; use --backend cpu"
    )

    @classmethod
    def check_available(cls) -> Availability:
        devices = sorted(glob.glob(DEVICE_GLOB))
        runtime = _runtime_found()
        if not devices:
            where = f"runtime found at {runtime}" if runtime else "no Neuron runtime either"
            return Availability.no(f"no Neuron devices (looked for {DEVICE_GLOB}); {where}")
        if not runtime:
            return Availability.no(
                f"{len(devices)} Neuron devices but no Neuron runtime (looked for "
                f"{', '.join(RUNTIME_GLOBS)} and python modules {', '.join(RUNTIME_MODULES)})")
        return Availability.yes(f"{len(devices)} Neuron devices, runtime at {runtime}")


    @classmethod
    def total_memory(cls) -> int:
        raise RuntimeError(_NO_MEMORY_QUERY)

    @classmethod
    def free_memory(cls) -> int:
        raise RuntimeError(_NO_MEMORY_QUERY)


# Nothing sizes a KV cache on Neuron until its worker exists (missing_kernels says so).
_NO_MEMORY_QUERY = ("Neuron device memory is not queried yet: it comes with the Neuron worker, "
                    "which is not implemented in this release")
