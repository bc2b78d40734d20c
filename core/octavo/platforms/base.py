"""The ``Platform`` interface: one class per kind of hardware.

A platform says whether its hardware is usable here (and why not), which distributed
backend and dtype suit it, how much memory it has, and which attention backend and
worker run on it. Platforms are registered through ``octavo_register_platforms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from octavo.worker.worker import Worker


@dataclass(frozen=True)
class Availability:
    """Whether a platform can run here; ``reason`` says what was looked for when it cannot."""

    available: bool
    reason: str

    @classmethod
    def yes(cls, reason: str) -> Availability:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


class Platform:
    """Base class of hardware platforms. Subclasses set the class attributes and
    implement :meth:`check_available`."""

    name: ClassVar[str]
    device_type: ClassVar[str]  # torch device type ("cpu", "cuda", ...) or the framework's name
    priority: ClassVar[int] = 0  # ``--backend auto`` picks the available platform with the highest
    dist_backend: ClassVar[str] = "gloo"  # torch.distributed backend between workers
    default_dtype: ClassVar[str] = "float32"
    attention_backend: ClassVar[str] = "torch"  # name in the attention-backend registry
    distribution: ClassVar[str] = "octavo"  # what to install to get this platform
    # Why the platform cannot run models yet even with its hardware present, or "" when it can.
    missing_kernels: ClassVar[str] = ""

    @classmethod
    def check_available(cls) -> Availability:
        """Probe the hardware and runtime. Must be cheap and never raise."""
        raise NotImplementedError

    @classmethod
    def is_available(cls) -> bool:
        return cls.check_available().available

    @classmethod
    def worker_class(cls) -> type[Worker]:
        """The worker that loads and runs the model on this platform. Imported when asked
        for: platforms are registered in processes that never build a worker."""
        from octavo.worker.worker import Worker

        return Worker

    @classmethod
    def total_memory(cls) -> int:
        """Bytes of device memory (host RAM for the CPU)."""
        raise NotImplementedError

    @classmethod
    def free_memory(cls) -> int:
        """Bytes of device memory free now."""
        raise NotImplementedError
