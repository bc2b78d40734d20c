"""``WorkerInterface``: what the engine asks of a worker, and ``WorkerClasses``, the parts
it is built with.

A platform names its worker class by qualified name (``Platform.worker_cls``); the engine
builds it as ``cls(config, platform, files, classes)`` once ``config.model.max_model_len``
is resolved, asks it how many KV blocks fit, has it allocate them, then hands it one
``SchedulerOutput`` per step. The worker returns plain data only (``ModelRunnerOutput``),
so it may run any framework (a JAX worker need not subclass the torch ``Worker``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from octavo.attention.base import AttentionBackend
from octavo.config import EngineConfig
from octavo.kv_transfer.base import KVConnector
from octavo.models.base import CausalLM
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform
from octavo.worker.spec_decode.proposer import Proposer


@dataclass(frozen=True)
class WorkerClasses:
    """What the config names for a worker, resolved in the plugin registries."""

    attn_backend: type[AttentionBackend]
    architectures: Mapping[str, type[CausalLM]]  # HF ``architectures`` name -> model class
    proposer: type[Proposer] | None = None  # speculative decoding's, when it is on
    kv_connector: type[KVConnector] | None = None  # a KV connector's, when one is set


class WorkerInterface(ABC):
    @abstractmethod
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 classes: WorkerClasses) -> None:
        """Load the model of ``files`` onto the device."""

    def get_kv_cache_spec(self) -> list[int | str | None]:
        """Each model layer's sliding window (None: full attention), or ``SSM_LAYER`` for a
        layer with a per-request state, from which both the engine and the worker derive
        the KV groups and the SSM state (``octavo.kv.cache_spec``). Empty, the default: every
        layer full attention, one group."""
        return []

    @abstractmethod
    def determine_num_blocks(self) -> int:
        """How many KV blocks fit the budget (``--kv-cache-memory`` or the device's)."""

    @abstractmethod
    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache (and a KV connector's worker side, when one is set)."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: the scheduled tokens through the model, the sampled tokens back."""
