"""``KVTransferScheduling``: the scheduler's side of a KV connector (disaggregated
prefill/decode), next to ``SpecScheduling`` for speculative decoding.

It keeps the requests whose prompt KV a connector is loading (they hold their blocks and
wait, while other requests run) and the finished requests whose blocks stay allocated until
the worker reports their KV saved, and it counts loads and saves for ``/metrics``.
"""

from __future__ import annotations

import logging

from octavo.kv.block import KVBlock
from octavo.kv.interface import KVCacheManagerInterface
from octavo.kv_transfer.base import KVConnector
from octavo.outputs import KVConnectorOutput, SchedulerOutput
from octavo.request import Request, RequestStatus
from octavo.stats import KVTransferStats

logger = logging.getLogger(__name__)


class KVTransferScheduling:
    def __init__(self, connector: KVConnector, kv_manager: KVCacheManagerInterface) -> None:
        self.connector = connector
        self.kv_manager = kv_manager
        # Loading: request and its number of computed tokens once the load is done.
        self.loading: dict[str, tuple[Request, int]] = {}
        self.sending: dict[str, Request] = {}  # finished, KV being saved
        self.stats = KVTransferStats()

    def back_from_load(self, request: Request) -> bool:
        """Whether a waiting request already holds its blocks: its load just finished."""
        return bool(self.kv_manager.get_block_ids(request.request_id))

    def start_load(self, request: Request, hit_blocks: list[KVBlock],
                   num_hit_tokens: int) -> bool | None:
        """Let the connector load what it holds of the prompt beyond the local prefix hit:
        the request waits, holding its blocks, until the worker reports the load. ``True``
        when a load started (the caller takes the request off the waiting queue), ``False``
        when there is nothing to load, ``None`` when its blocks do not fit now."""
        num_external, _ = self.connector.get_num_new_matched_tokens(request, num_hit_tokens)
        if num_external == 0:
            return False
        if self.kv_manager.allocate_slots(request, num_external, hit_blocks,
                                          delay_cache_blocks=True) is None:
            return None
        request.num_computed_tokens = num_hit_tokens
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.loading[request.request_id] = (request, num_hit_tokens + num_external)
        self.connector.update_state_after_alloc(
            request, self.kv_manager.get_block_ids(request.request_id), num_external)
        return True

    def attach_metadata(self, output: SchedulerOutput) -> None:
        output.kv_connector_metadata = self.connector.build_connector_meta(output)

    def update(self, output: KVConnectorOutput) -> list[Request]:
        """The worker's report: free the blocks of requests whose KV is saved; return the
        requests whose load finished, to wait again - from the loaded tokens, or from their
        local prefix when the load failed (nothing was computed on top of it, so
        recomputing is safe)."""
        self.connector.update_connector_output(output)
        self.stats.saves += len(output.finished_sending)
        for request_id in output.finished_sending:
            finished = self.sending.pop(request_id, None)
            if finished is not None:
                self.kv_manager.free(finished)
        loaded: list[Request] = []
        for request_id in output.finished_recving:
            request, num_loaded = self.loading.pop(request_id, (None, 0))
            if request is None:
                continue  # aborted while loading
            if request_id in output.failed_recving:
                self.stats.failed_loads += 1
                logger.warning("request %s: loading its prompt KV failed; computing it instead",
                               request_id)
            else:
                self.stats.loads += 1
                self.stats.loaded_tokens += num_loaded - request.num_computed_tokens
                request.num_computed_tokens = num_loaded
            request.status = RequestStatus.WAITING
            loaded.append(request)
        return loaded

    def keeps_blocks(self, request: Request) -> bool:
        """A request finished: whether its blocks must stay until its KV is saved (then
        the scheduler must not free them; :meth:`update` does, later)."""
        block_ids = self.kv_manager.get_block_ids(request.request_id)
        delay_free, _ = self.connector.request_finished(request, block_ids)
        if delay_free:
            self.sending[request.request_id] = request
        return delay_free
