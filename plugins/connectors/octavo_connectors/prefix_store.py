"""``PrefixStoreConnector``: the KV connector logic both shipped connectors share; they
differ only in the ``BlobStore`` the KV goes to (files, or a Mooncake store).

What is stored: for a prompt of ``n`` tokens, the KV of its first ``(n - 1) // block_size``
blocks (the last token is always recomputed - its logits are sampled), one blob per layer,
under the prefix's chained block hash (``octavo.block_hash``), which stands for every token
of the prefix. A ``done`` blob, written after every layer, marks the entry complete, so a
reader never loads a half-written prefix. A consumer looks for the longest stored prefix of
its prompt beyond its local prefix-cache hit; a producer saves each prompt once its prefill
is computed, layer by layer as the forward pass goes.

With several workers each rank stores its shard (its KV heads, its pipeline stage's layers)
under names carrying the rank and the layout (``@tp1of2-pp0of1``), with a ``done`` blob of
its own; an entry counts as stored when every rank of the consumer's layout has its done
blob. A consumer with another layout finds nothing and computes the prompt.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from octavo.plugin_api import (
    AttentionMetadata,
    KVConnector,
    KVConnectorOutput,
    KVConnectorRole,
    KVTransferConfig,
    RankInfo,
    Request,
    SchedulerOutput,
    update_block_hashes,
)

logger = logging.getLogger(__name__)


class BlobStore:
    """Named byte strings. ``put`` must be atomic: ``get`` sees all of a blob or none."""

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def put(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, name: str) -> bytes:
        """The blob; raises ``KeyError`` when it is missing."""
        raise NotImplementedError


@dataclass
class LoadSpec:
    req_id: str
    key: str  # the stored prefix
    block_ids: list[int]  # where its blocks from ``first_block`` on go
    first_block: int  # stored blocks before this one are local prefix-cache hits


@dataclass
class SaveSpec:
    req_id: str
    key: str
    block_ids: list[int]  # the prefix's blocks, in order


@dataclass
class PrefixStoreMetadata:
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


def shard_suffix(ranks: RankInfo) -> str:
    """What tells one rank's blobs from another's ("" with one worker)."""
    if ranks.world_size == 1:
        return ""
    return f"@tp{ranks.tp_rank}of{ranks.tp_size}-pp{ranks.pp_rank}of{ranks.pp_size}"


def layer_blob(key: str, layer_index: int, ranks: RankInfo) -> str:
    """``layer_index``: of the rank's stage, which the suffix names."""
    return f"{key}/layer_{layer_index:03d}{shard_suffix(ranks)}"


def done_blob(key: str, ranks: RankInfo) -> str:
    return f"{key}/done{shard_suffix(ranks)}"


def every_rank(layout: RankInfo) -> list[RankInfo]:
    """Each rank of ``layout``'s tensor x pipeline grid."""
    return [RankInfo.of(rank, layout.tp_size, layout.pp_size)
            for rank in range(layout.world_size)]


class PrefixStoreConnector(KVConnector):
    metadata_type = PrefixStoreMetadata

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int) -> None:
        super().__init__(config, role, block_size)
        self.store = self.make_store()
        # Scheduler side.
        self._requests: dict[str, Request] = {}  # producer: prompts to save once computed
        self._block_ids: dict[str, list[int]] = {}
        self._saved: set[str] = set()  # a save was scheduled
        self._sending: set[str] = set()  # ... and the worker has not reported it done
        self._pending_loads: list[LoadSpec] = []
        # Worker side.
        self._kv_caches: list[torch.Tensor] = []
        self._metadata = PrefixStoreMetadata()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-save")
        self._writes: dict[str, list[Future[None]]] = {}
        self._finished_sending: set[str] = set()
        self._finished_recving: set[str] = set()
        self._failed_loads: set[str] = set()

    def make_store(self) -> BlobStore:
        raise NotImplementedError

    def _key(self, request: Request, num_blocks: int) -> str:
        return update_block_hashes(request, self.block_size)[num_blocks - 1].hex()

    def _num_prefix_blocks(self, request: Request) -> int:
        return (request.num_prompt_tokens - 1) // self.block_size

    # -- scheduler side ------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> tuple[int, bool]:
        if self.config.is_producer:
            self._requests[request.request_id] = request
        if not self.config.is_consumer or request.sampling_params.prompt_logprobs is not None:
            return 0, False  # prompt logprobs need every prompt position's logits
        num_local_blocks = num_local_computed_tokens // self.block_size
        for num_blocks in range(self._num_prefix_blocks(request), num_local_blocks, -1):
            if self._stored(self._key(request, num_blocks)):
                return num_blocks * self.block_size - num_local_computed_tokens, True
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        first = request.num_computed_tokens // self.block_size
        end = first + num_external_tokens // self.block_size
        self._pending_loads.append(LoadSpec(request.request_id, self._key(request, end),
                                            block_ids[first:end], first))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> PrefixStoreMetadata:
        metadata = PrefixStoreMetadata(loads=self._pending_loads)
        self._pending_loads = []
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._requests:
                self._block_ids[new.req_id] = list(new.block_ids)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids):
            if req_id in self._block_ids:
                self._block_ids[req_id].extend(new_block_ids)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self._requests.get(req_id)
            if request is None or req_id in self._saved:
                continue
            num_blocks = self._num_prefix_blocks(request)
            # Saved in the step that completes the prompt: every prefix block is then written.
            if num_blocks == 0 or request.num_computed_tokens < request.num_prompt_tokens:
                continue
            self._saved.add(req_id)
            key = self._key(request, num_blocks)
            if self._stored(key):
                continue  # stored already (by another engine, or loaded from there)
            metadata.saves.append(SaveSpec(req_id, key, self._block_ids[req_id][:num_blocks]))
            self._sending.add(req_id)
        return metadata

    def _stored(self, key: str) -> bool:
        """Every rank of this engine's layout saved its shard of the prefix ``key``."""
        return all(self.store.exists(done_blob(key, ranks)) for ranks in every_rank(self.ranks))

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        self._sending -= output.finished_sending

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        for state in (self._requests, self._block_ids):
            state.pop(req_id, None)
        self._saved.discard(req_id)
        return req_id in self._sending, None

    # -- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        self._kv_caches = kv_caches

    def bind_connector_metadata(self, metadata: PrefixStoreMetadata) -> None:
        self._metadata = metadata

    def start_load_kv(self) -> None:
        """Load every layer of this step's prefixes now: their requests are not computed in
        this step, so nothing waits per layer; a failed load is reported, not raised."""
        for spec in self._metadata.loads:
            try:
                self._load(spec)
            except Exception as exc:  # a missing, corrupt or mismatched entry: recompute
                logger.warning("KV load of request %s (prefix %s) failed: %s",
                               spec.req_id, spec.key[:16], exc)
                self._failed_loads.add(spec.req_id)
            self._finished_recving.add(spec.req_id)

    def _load(self, spec: LoadSpec) -> None:
        block_ids = torch.tensor(spec.block_ids, device=self._kv_caches[0].device)
        num_blocks = spec.first_block + len(spec.block_ids)
        for index, kv_cache in enumerate(self._kv_caches):
            stored = load_tensors(self.store.get(layer_blob(spec.key, index, self.ranks)))["kv"]
            expected = (kv_cache.shape[0], num_blocks, *kv_cache.shape[2:])
            if tuple(stored.shape) != expected or stored.dtype != kv_cache.dtype:
                raise ValueError(f"layer {index} holds {tuple(stored.shape)} {stored.dtype}; "
                                 f"this engine needs {expected} {kv_cache.dtype}")
            kv_cache[:, block_ids] = stored[:, spec.first_block:].to(kv_cache.device)

    def save_kv_layer(self, layer_index: int, kv_cache: torch.Tensor,
                      attn_metadata: AttentionMetadata) -> None:
        """Copy out this layer's prefix blocks and write them in the background while the
        next layers compute."""
        for spec in self._metadata.saves:
            blocks = kv_cache[:, spec.block_ids].cpu()  # indexing copies
            name = layer_blob(spec.key, layer_index, self.ranks)
            self._writes.setdefault(spec.req_id, []).append(
                self._writer.submit(self._put_tensor, name, blocks))

    def _put_tensor(self, name: str, tensor: torch.Tensor) -> None:
        self.store.put(name, save_tensors({"kv": tensor.contiguous()}))

    def wait_for_save(self) -> None:
        """Finish this step's writes and mark their prefixes complete, so the engine's
        answer never gets ahead of the KV a decode instance will look for."""
        for spec in self._metadata.saves:
            try:
                for write in self._writes.pop(spec.req_id, []):
                    write.result()
                # b"1", not b"": Mooncake refuses empty values.
                self.store.put(done_blob(spec.key, self.ranks), b"1")
            except Exception as exc:  # the prefix stays incomplete: consumers recompute it
                logger.warning("KV save of request %s (prefix %s) failed: %s",
                               spec.req_id, spec.key[:16], exc)
            self._finished_sending.add(spec.req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        sending, recving = self._finished_sending, self._finished_recving
        self._finished_sending, self._finished_recving = set(), set()
        return sending, recving

    def get_failed_loads(self) -> set[str]:
        failed, self._failed_loads = self._failed_loads, set()
        return failed
