"""``KVCacheManagerInterface``: what the scheduler asks of a KV-cache manager.

A plugin replaces the cache manager by registering a subclass through
``octavo_register_kv_managers`` and naming it with ``--kv-manager NAME``. The engine builds
it as ``cls(num_blocks, block_size, enable_caching=...)`` once the worker has sized the
cache. Block ids it hands out index the workers' KV tensors, so they must lie in
``[0, num_blocks)``, and a block held by a running request must never be handed to another
unless both share its tokens (prefix caching).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from octavo.kv.block import KVBlock
from octavo.request import Request
from octavo.stats import PrefixCacheStats


class KVCacheManagerInterface(ABC):
    prefix_stats: PrefixCacheStats  # counted at a request's first allocation
    # KV groups, each with its own block tables (several: ``KVCacheCoordinator``). With more
    # than one, ``allocate_slots`` returns every group's new blocks, which
    # ``group_new_block_ids`` splits, and ``get_block_ids`` is group 0's table.
    num_kv_groups: int = 1

    @abstractmethod
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        ...

    @property
    @abstractmethod
    def usage(self) -> float:
        """Share of blocks held by requests, in [0, 1] (``/metrics``' KV-cache usage)."""

    @abstractmethod
    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of a waiting request: its blocks and their tokens.
        Never the whole sequence (the last token's logits are needed)."""

    @abstractmethod
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVBlock] = (),
                       num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> list[KVBlock] | None:
        """Room for ``num_new_tokens`` (and lookahead) after the computed tokens: the new
        blocks, or ``None`` - changing nothing - when the pool cannot supply them."""

    @abstractmethod
    def free(self, request: Request) -> None:
        """Release every block of a finished, aborted or preempted request."""

    @abstractmethod
    def free_trailing_blocks(self, request: Request, num_tokens: int) -> int | None:
        """Release blocks past the first ``num_tokens``; how many it keeps, or ``None``."""

    @abstractmethod
    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (empty when it holds none)."""

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        """Every KV group's block table, in group order."""
        return [self.get_block_ids(request_id)]

    def get_state_slot(self, request_id: str) -> int:
        """The request's slot of the per-request state of SSM layers (``StateSlotPool``);
        -1 for a manager of a model without them."""
        del request_id
        return -1

    def group_new_block_ids(self, new_blocks: Sequence[KVBlock]) -> list[list[int]]:
        """The new blocks ``allocate_slots`` returned, as block ids per KV group."""
        return [[block.block_id for block in new_blocks]]

    @abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget every cached block no request holds."""
