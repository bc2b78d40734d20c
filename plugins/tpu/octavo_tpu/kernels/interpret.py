"""How the kernels' ``interpret`` argument maps onto Pallas TPU interpret mode."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu


def interpret_params(interpret: bool | pltpu.InterpretParams) -> pltpu.InterpretParams | bool:
    """``True`` runs the kernel on the CPU in TPU interpret mode (simulated HBM, VMEM, DMAs and
    semaphores) with its defaults; an ``InterpretParams`` (e.g. ``detect_races=True``) is
    passed through; ``False`` compiles it for the TPU."""
    if interpret is True:
        return pltpu.InterpretParams()
    return interpret
