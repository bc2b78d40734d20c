"""``KVConnector``: the contract between Octavo and a KV transfer backend (vLLM V1's
``KVConnectorBase_V1`` in Octavo's terms).

One class, built twice per engine: once in the scheduler (``KVConnectorRole.SCHEDULER``),
once in the worker that owns the KV cache (``KVConnectorRole.WORKER``). The two instances
only talk through plain data: the scheduler side's per-step metadata rides on the
``SchedulerOutput``; the worker side's report (finished sends and receives, failed loads)
comes back on the ``ModelRunnerOutput`` as a ``KVConnectorOutput``.

Loads are asynchronous in the scheduler's eyes: a request whose prompt KV can be loaded
waits (``WAITING_FOR_REMOTE_KVS``) while the worker fills its blocks, and other requests
keep running. Only when the worker reports the load finished does the request continue
from the loaded tokens; when it reports the load failed, the request computes its prompt
itself - nothing was computed on top of the missing KV, so the output stays correct.

With several workers (tensor or pipeline parallelism) there is one worker-side instance per
rank, each holding its rank's shard of every block (its KV heads, its stage's layers), and
``ranks`` says which: the engine sets it right after building each instance (the scheduler
side gets rank 0 of the same layout, so ``ranks.world_size`` tells it how many shards make
one stored block). A worker in its own process receives the metadata msgpack-encoded;
``metadata_type`` names the type it is decoded into.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from octavo.distributed.state import RankInfo

if TYPE_CHECKING:
    import torch

    from octavo.attention.base import AttentionMetadata
    from octavo.config.kv_transfer import KVTransferConfig
    from octavo.outputs import KVConnectorOutput, SchedulerOutput
    from octavo.request import Request


class KVConnectorRole(enum.Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


class KVConnector(ABC):
    """Subclasses implement the side(s) of their role; the scheduler calls only the
    scheduler-side methods on its instance, the worker only the worker-side ones."""

    # The type ``build_connector_meta`` returns (a dataclass); None: the worker side gets
    # the metadata as msgpack's plain dicts and lists when it runs in another process.
    metadata_type: ClassVar[Any] = None
    # This instance's worker rank (see the module docstring); one rank until the engine says.
    ranks: RankInfo = RankInfo()

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int) -> None:
        self.config = config
        self.role = role
        self.block_size = block_size

    # -- scheduler side ------------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> tuple[int, bool]:
        """How many prompt tokens after the ``num_local_computed_tokens`` found in the local
        prefix cache can be loaded from outside, and whether the load is asynchronous.
        Must leave at least the last prompt token to compute (its logits are sampled)."""

    @abstractmethod
    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        """The scheduler gave ``request`` the blocks ``block_ids`` (its whole block table);
        the ``num_external_tokens`` after its local prefix are to be loaded into them."""

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        """What the worker side must do this step (loads to start, saves to make): plain
        data, attached to ``scheduler_output.kv_connector_metadata``."""

    def update_connector_output(self, output: KVConnectorOutput) -> None:  # noqa: B027
        """The worker's report of the last step (finished sends, receives, failed loads);
        optional: a connector that keeps no state between steps ignores it."""

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """``request`` finished. Returns whether its blocks must stay allocated until the
        worker reports its save finished, and parameters a peer would need to fetch its KV
        (none for connectors that key KV by content)."""
        return False, None

    # -- worker side ---------------------------------------------------------------------
    @abstractmethod
    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        """The worker's KV cache, one tensor per layer (layout in ``attention.base``)."""

    @abstractmethod
    def bind_connector_metadata(self, metadata: Any) -> None:
        """This step's metadata from the scheduler side; set before ``start_load_kv``."""

    @abstractmethod
    def start_load_kv(self) -> None:
        """Begin this step's loads; called before the forward pass."""

    def wait_for_layer_load(self, layer_index: int) -> None:  # noqa: B027
        """Block until the loads into ``layer_index`` that this step's attention reads are
        done. Connectors whose loads all finish before the request is scheduled for compute
        (the asynchronous case) have nothing to wait for."""

    @abstractmethod
    def save_kv_layer(self, layer_index: int, kv_cache: torch.Tensor,
                      attn_metadata: AttentionMetadata) -> None:
        """Start saving this step's KV of ``layer_index``; called after the layer ran."""

    @abstractmethod
    def wait_for_save(self) -> None:
        """Called after the forward pass: block until saves that must not outlive the step
        are done."""

    @abstractmethod
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Requests whose sends and whose receives finished since the last call
        (successfully or not; failures are in ``get_failed_loads``)."""

    def get_failed_loads(self) -> set[str]:
        """Requests whose load failed since the last call: they recompute their prompt."""
        return set()
