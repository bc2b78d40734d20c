"""Shared memory between Octavo's processes: attaching to another process's segment, and a
memory fence for the flags and counters that hand data over through it (the executor's
broadcast queue, the CPU's tensor-parallel all-reduce)."""

from __future__ import annotations

import threading
from multiprocessing import resource_tracker, shared_memory

_FENCE = threading.Lock()


def memory_fence() -> None:
    """Keep the data accesses on their side of a flag access as other cores see them:
    CPython runs our loads and stores in program order, but a weakly ordered CPU (ARM,
    POWER) need not show them in it. Python has no bare fence; a lock's acquire and release
    are atomic read-modify-writes, barriers to the CPU (full ones on x86), as vLLM's
    shm_broadcast relies on. (x86 alone keeps stores after stores and loads after loads.)"""
    _FENCE.acquire()
    _FENCE.release()


def attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Open another process's segment without registering it with this process's resource
    tracker, which would unlink it when this process exits - under its owner.

    Python before 3.13 (no ``track=False``) registers every segment it opens. Unregistering
    after the attach is not enough where processes share one tracker (children of one
    ``multiprocessing`` spawn do): it keeps one entry per name, so the first unregister
    drops the owner's and the next ones fail with a traceback. So ``register`` is a no-op
    during the attach, as vLLM does. The swap is process-wide: attach while no other thread
    creates a segment.
    """
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register
