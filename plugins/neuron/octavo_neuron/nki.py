"""The one import point of NKI for Octavo's kernels: ``from octavo_neuron.nki import nki, nl,
nisa``.

The real NKI (``neuronxcc.nki``, or the standalone ``nki`` package) when it is importable,
as on a Neuron host; else the numpy emulator (``octavo_neuron.nki_emulator``), a test
instrument that runs the same kernels on any machine and enforces the hardware rules.
``EMULATED`` says which one this process got.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def _real_nki() -> tuple[ModuleType, ModuleType, ModuleType] | None:
    """``(nki, language, isa)`` of the real NKI; PyPI's ``nki`` is an empty placeholder, so
    only a package whose language and isa import counts."""
    for name in ("neuronxcc.nki", "nki"):
        try:
            return tuple(importlib.import_module(module)  # type: ignore[return-value]
                         for module in (name, f"{name}.language", f"{name}.isa"))
        except ImportError:
            continue
    return None


_real = _real_nki()
if _real is not None:
    nki, nl, nisa = _real
    EMULATED = False
else:
    from octavo_neuron import nki_emulator as nki
    from octavo_neuron.nki_emulator import isa as nisa
    from octavo_neuron.nki_emulator import language as nl

    EMULATED = True

__all__ = ["EMULATED", "nki", "nisa", "nl"]
