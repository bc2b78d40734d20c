"""Counting XLA compilations, to prove that serving compiles nothing after warm-up.

JAX reports each jit cache miss as a ``jaxpr_to_mlir_module`` event (even when the
persistent compilation cache then supplies the binary): after warm-up every step must hit
a program compiled at start-up, and any miss is counted and logged with its shapes' cost.
"""

from __future__ import annotations

import logging
import threading

import jax

logger = logging.getLogger("octavo.tpu")
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

_lock = threading.Lock()
_count = 0
_installed = False


def _on_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    del duration_secs, kwargs
    global _count
    if event == LOWERING_EVENT:
        with _lock:
            _count += 1


def install() -> None:
    """Start counting (once per process: JAX listeners cannot be removed)."""
    global _installed
    if not _installed:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _installed = True


def compile_count() -> int:
    """Compilations (jit cache misses) in this process since :func:`install`."""
    return _count


class CompileGuard:
    """Armed after warm-up: ``check()`` after each step counts what compiled since."""

    def __init__(self) -> None:
        install()
        self.armed_at: int | None = None
        self.compiles_while_serving = 0

    def arm(self) -> None:
        self.armed_at = compile_count()

    def check(self, what: str) -> None:
        if self.armed_at is None:
            return
        new = compile_count() - self.armed_at - self.compiles_while_serving
        if new:
            self.compiles_while_serving += new
            logger.warning("tpu: %d XLA compilation(s) while serving (%s): a shape missed "
                           "the buckets compiled at start-up", new, what)
