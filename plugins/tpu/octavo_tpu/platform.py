"""The TPU platform: available when JAX is installed and sees TPU devices."""

from __future__ import annotations

import importlib.util

from octavo.plugin_api import Availability, Platform


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "tpu"
    priority = 80
    dist_backend = "jax"  # TPU workers talk through JAX collectives, not torch.distributed
    default_dtype = "bfloat16"
    attention_backend = "pallas"
    distribution = "octavo-tpu"
    missing_kernels = (
        "the JAX model runner and Pallas attention kernels are not implemented yet in this "
        "release; use --backend cpu"
    )

    @classmethod
    def check_available(cls) -> Availability:
        if importlib.util.find_spec("jax") is None:
            return Availability.no("JAX is not installed (looked for the 'jax' module); "
                                   "install it with: pip install 'jax[tpu]'")
        try:
            import jax

            devices = jax.devices("tpu")
        except Exception as exc:  # jax raises RuntimeError when no TPU backend initialises
            return Availability.no(f"JAX sees no TPU devices ({type(exc).__name__}: {exc})")
        return Availability.yes(f"{len(devices)} x {devices[0].device_kind}")

    @classmethod
    def total_memory(cls) -> int:
        import jax

        return int(jax.devices("tpu")[0].memory_stats()["bytes_limit"])

    @classmethod
    def free_memory(cls) -> int:
        import jax

        stats = jax.devices("tpu")[0].memory_stats()
        return int(stats["bytes_limit"] - stats["bytes_in_use"])
