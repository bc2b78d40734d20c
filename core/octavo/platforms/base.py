"""The ``Platform`` interface: one class per kind of hardware.

A platform says whether its hardware is usable here (and why not), which distributed
backend and dtype suit it, how much memory it has, which attention backend and worker run
on it, and how a loaded model is specialised for it (fused kernels, prepacked weights).
Platforms are registered through ``octavo_register_platforms``; the classes themselves are
used (no instances), so every method is a classmethod.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from octavo.config.errors import ConfigError

if TYPE_CHECKING:  # torch only for annotations: listing platforms must not import it
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup

    from octavo.config.compilation import CompilationConfig
    from octavo.distributed.state import TensorCommunicator
    from octavo.request import Request


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


class Platform(ABC):
    """Base class of hardware platforms.

    Contract for subclasses:

    - set ``name`` (what ``--backend`` takes) and ``device_type`` (torch's device type, or
      the framework's name for a non-torch worker);
    - :meth:`check_available` probes the hardware cheaply and never raises: ``--backend
      auto`` and ``octavo plugins`` call it for every installed platform;
    - :meth:`total_memory` / :meth:`free_memory` answer in bytes for the device (host RAM
      for the CPU); the worker sizes the KV cache from them;
    - ``worker_cls`` is the qualified name of the worker class, imported only when a worker
      starts (:func:`octavo.qualname.resolve_qualname`);
    - :meth:`prepare_model` may swap a loaded model's layers onto the platform's kernels,
      computing the same thing; the worker calls it once after loading, and so do
      proposers for the heads they build;
    - a worker process of a multi-worker engine calls :meth:`init_worker_process` first
      (bind its cores, pick its device), then :meth:`tensor_communicator` once its process
      group exists;
    - :meth:`validate_request` refuses, in the front end, a request the platform's worker
      cannot run, so that no step ever holds one (a refusal inside a step would fail every
      request of that step).
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    priority: ClassVar[int] = 0  # ``--backend auto`` picks the available platform with the highest
    dist_backend: ClassVar[str] = "gloo"  # torch.distributed backend between workers
    default_dtype: ClassVar[str] = "float32"
    attention_backend: ClassVar[str] = "torch"  # name in the attention-backend registry
    worker_cls: ClassVar[str] = "octavo.worker.worker.Worker"
    distribution: ClassVar[str] = "octavo"  # what to install to get this platform
    # Why the platform cannot run models yet even with its hardware present, or "" when it can.
    missing_kernels: ClassVar[str] = ""
    # The --kv-cache-dtype values its worker stores (auto: the model's dtype); the attention
    # backend must support the value too.
    kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    # One worker process drives all of an engine's devices (a JAX single controller with a
    # device mesh): the engine keeps that worker in its own process for any world size.
    single_controller: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def check_available(cls) -> Availability:
        """Probe the hardware and runtime. Must be cheap and never raise."""

    @classmethod
    def is_available(cls) -> bool:
        return cls.check_available().available

    @classmethod
    @abstractmethod
    def total_memory(cls) -> int:
        """Bytes of device memory (host RAM for the CPU)."""

    @classmethod
    @abstractmethod
    def free_memory(cls) -> int:
        """Bytes of device memory free now."""

    @classmethod
    def prepare_model(cls, model: nn.Module, dtype: torch.dtype) -> int:
        """Specialise a loaded ``model`` (weights in place) for this platform; returns how
        many layers were changed. The portable default changes nothing."""
        del model, dtype
        return 0

    @classmethod
    def lora_kernels(cls) -> tuple[Callable[..., None], Callable[..., None]] | None:
        """This platform's ``(lora_shrink, lora_expand)``, with the signatures of
        ``octavo.lora.ops`` (vLLM V1's split of a LoRA delta); None: those portable ones."""
        return None

    @classmethod
    def lora_delta(cls) -> Callable[..., Any] | None:
        """This platform's ``octavo.lora.ops.BindDelta``: a wrapped layer's whole delta in
        one call instead of a shrink/expand pair per slice; None: the pair per slice."""
        return None

    @classmethod
    def compile_model(cls, model: nn.Module, compilation: CompilationConfig) -> None:
        """``-O``: prepare a loaded ``model`` to run through ``torch.compile`` instead of
        ``prepare_model``'s specialisation. The portable default refuses: a platform says
        how it compiles (the CPU's: ``octavo.cpu.compile``)."""
        del model
        raise ConfigError(f"compilation_config level {compilation.level} (-O, torch.compile) "
                          f"is not supported on the {cls.name} backend; use -O0 (the "
                          f"default) or --enforce-eager")

    @classmethod
    def validate_request(cls, request: Request) -> None:
        """Raise ``ValueError`` naming the setting when this platform's worker cannot run
        ``request`` (vLLM's ``Platform.validate_request``). Called by the front end's
        ``Processor`` for every request before it is sent to the engine; the refusal is the
        client's 400. The portable default runs everything the engine offers."""
        del request

    @classmethod
    def init_worker_process(cls, rank: int, world_size: int) -> None:
        """Prepare the process of worker ``rank`` (of ``world_size`` on this machine) before
        anything touches the device: its cores, its device index."""
        del rank, world_size

    @classmethod
    def tensor_communicator(cls, group: ProcessGroup, rank_in_group: int,
                            fallback: TensorCommunicator) -> TensorCommunicator:
        """The tensor-parallel group's collectives; ``fallback`` runs them over the
        process group (``dist_backend``). Called by every rank of the group together."""
        del group, rank_in_group
        return fallback
