"""The TPU platform: a JAX worker (``octavo_tpu.worker.TpuWorker``) on the TPU devices JAX
sees, or, with ``OCTAVO_TPU_INTERPRET=1`` in the environment (read once, at import, as the
device kind must be fixed before a worker starts), on JAX's CPU devices with every Pallas
kernel in TPU interpret mode - to check the runner and kernels against the engine's
answers, not for speed. ``--backend auto`` never picks interpret mode (its priority is
below the CPU's).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from octavo.plugin_api import Availability, CpuPlatform, Platform, Request

INTERPRET_ENV = "OCTAVO_TPU_INTERPRET"
INTERPRET = os.environ.get(INTERPRET_ENV) == "1"
JAX_MISSING = ("JAX is not installed (looked for the 'jax' module); install it with: "
               "pip install 'jax[tpu]'")
# JAX reaches a TPU only through libtpu: the 'libtpu' package that jax[tpu] installs, or a
# library named by TPU_LIBRARY_PATH. Without either, JAX sees no TPU, and the check says so
# without importing JAX (about a second, paid by every engine start with --backend auto).
# Top logprobs every step computes (the OpenAI server's max_logprobs, as vLLM's default):
# one compiled sampler serves every request, so a request may ask for at most that many.
TOP_LOGPROBS = 20
LIBTPU_MISSING = ("JAX sees no TPU devices (no libtpu: neither the 'libtpu' module nor "
                  "TPU_LIBRARY_PATH); on a TPU VM install it with: pip install 'jax[tpu]'")


def devices() -> list[Any]:
    """The devices a worker runs on: TPUs, or the CPU devices in interpret mode."""
    import jax

    return jax.devices("cpu" if INTERPRET else "tpu")


def interpret_params() -> object:
    """What the Pallas kernels take as ``interpret=``: TPU interpret mode on the CPU, or
    False to lower them with Mosaic for a real TPU."""
    if not INTERPRET:
        return False
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "cpu" if INTERPRET else "tpu"
    priority = -10 if INTERPRET else 80  # interpret mode is for tests: auto keeps the CPU
    dist_backend = "jax"  # one process drives every device: no torch.distributed
    default_dtype = "float32" if INTERPRET else "bfloat16"
    # The core's torch model is built only to load the weights (then converted to jax
    # arrays); the JAX model's attention is the Pallas ragged paged attention.
    attention_backend = "torch"
    worker_cls = "octavo_tpu.worker.TpuWorker"
    distribution = "octavo-tpu"
    single_controller = True  # -tp N: one worker, one device mesh

    @classmethod
    def check_available(cls) -> Availability:
        if importlib.util.find_spec("jax") is None:
            return Availability.no(JAX_MISSING)
        if not INTERPRET and not (importlib.util.find_spec("libtpu")
                                  or os.environ.get("TPU_LIBRARY_PATH")):
            return Availability.no(LIBTPU_MISSING)
        try:
            found = devices()
        except Exception as exc:  # jax raises RuntimeError when no TPU backend initialises
            return Availability.no(f"JAX sees no TPU devices ({type(exc).__name__}: {exc})")
        if INTERPRET:
            return Availability.yes(
                f"interpret mode on {len(found)} CPU devices ({INTERPRET_ENV}=1): Pallas "
                "kernels in TPU interpret mode; for correctness, not speed")
        return Availability.yes(f"{len(found)} x {found[0].device_kind}")

    @classmethod
    def validate_request(cls, request: Request) -> None:
        """Refuse, naming the setting, what the JAX runner does not compute: prompt
        logprobs, structured outputs and prompt embeddings are not wired into the JAX model
        and sampler, and more logprobs than every step computes."""
        params = request.sampling_params
        unsupported = [name for name, on in (
            ("prompt_logprobs", params.prompt_logprobs is not None),
            ("structured_outputs", params.structured_outputs is not None),
            ("prompt_embeds", request.prompt_embeds is not None),
            (f"logprobs > {TOP_LOGPROBS}", (params.logprobs or 0) > TOP_LOGPROBS),
        ) if on]
        if unsupported:
            raise ValueError(f"the tpu backend does not compute {', '.join(unsupported)} in "
                             "this release (use --backend cpu)")

    @classmethod
    def total_memory(cls) -> int:
        if INTERPRET:
            return CpuPlatform.total_memory()  # interpret mode runs in RAM
        return int(devices()[0].memory_stats()["bytes_limit"])

    @classmethod
    def free_memory(cls) -> int:
        if INTERPRET:
            return CpuPlatform.free_memory()
        stats = devices()[0].memory_stats()
        return int(stats["bytes_limit"] - stats["bytes_in_use"])
