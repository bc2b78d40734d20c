"""``resolve_qualname("pkg.module.Name")``: the object a dotted name points to, imported when
asked for. Platforms name their worker class this way (vLLM's ``worker_cls``), so a process
that only lists platforms never imports a worker, and the platform module needs no import
of the worker package above it."""

from __future__ import annotations

import importlib
from typing import Any


def resolve_qualname(qualname: str) -> Any:
    """Import ``module.path`` and return its attribute ``Name``; the error names the
    qualname and what is missing."""
    module_name, _, attr = qualname.rpartition(".")
    if not module_name:
        raise ImportError(f"{qualname!r} is not a qualified name (package.module.Name)")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{qualname!r}: module {module_name!r} has no attribute "
                          f"{attr!r}") from None
