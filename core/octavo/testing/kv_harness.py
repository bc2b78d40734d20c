"""Drives a KV connector as an engine does, with no model: its scheduler side and its worker
side, the calls in the engine's order, real KV-cache tensors, plain-data steps built by hand.

A producer engine computes a prompt (its "forward pass" writes known K/V into the request's
blocks, layer by layer, between ``wait_for_layer_load`` and ``save_kv_layer``) and finishes
it; a consumer engine looks the prompt up, gives the request blocks and runs steps with
nothing scheduled - the request waits for its load - until the worker reports the load.
Connector calls that raise come out as :class:`ConnectorRaised`, naming the call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from octavo.plugin_api import (
    AttentionMetadata,
    CachedRequestData,
    KVConnector,
    KVConnectorOutput,
    KVConnectorRole,
    KVTransferConfig,
    NewRequestData,
    Request,
    RequestStatus,
    SamplingParams,
    SchedulerOutput,
)


class ConnectorRaised(Exception):
    """A connector call raised; ``call`` names it, the cause is the connector's exception."""

    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise ConnectorRaised(name) from exc


@dataclass(frozen=True)
class CacheLayout:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: str

    def noise(self, gen: torch.Generator, num_blocks: int | None = None) -> torch.Tensor:
        """Random K/V for ``num_blocks`` blocks (default: a whole layer's cache)."""
        shape = (2, num_blocks or self.num_blocks, self.block_size, self.num_kv_heads,
                 self.head_dim)
        return torch.randn(shape, generator=gen).to(self.dtype).to(self.device)

    def prompt_kv(self, gen: torch.Generator, num_tokens: int) -> list[torch.Tensor]:
        """A prompt's computed K/V, per layer ``[2, num_tokens, kv_heads, head_dim]``."""
        return [torch.randn(2, num_tokens, self.num_kv_heads, self.head_dim, generator=gen)
                .to(self.dtype).to(self.device) for _ in range(self.num_layers)]

    def slots(self, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        positions = torch.arange(num_tokens)
        blocks = torch.tensor(block_ids, dtype=torch.int64)[positions // self.block_size]
        return (blocks * self.block_size + positions % self.block_size).to(self.device)

    def read(self, cache: torch.Tensor, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        rows = cache.view(2, -1, self.num_kv_heads, self.head_dim)
        return rows[:, self.slots(block_ids, num_tokens)]

    def write(self, cache: torch.Tensor, block_ids: list[int], kv: torch.Tensor) -> None:
        rows = cache.view(2, -1, self.num_kv_heads, self.head_dim)
        rows[:, self.slots(block_ids, kv.shape[1])] = kv


@dataclass
class Engine:
    """One engine's connector: both sides, the worker's KV caches, its free blocks."""

    scheduler: KVConnector
    worker: KVConnector
    caches: list[torch.Tensor]
    layout: CacheLayout
    rng: random.Random
    free_blocks: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, connector: type[KVConnector], config: KVTransferConfig, layout: CacheLayout,
              seed: int) -> Engine:
        gen = torch.Generator().manual_seed(seed)
        scheduler = call("the scheduler side's constructor", connector, config,
                         KVConnectorRole.SCHEDULER, layout.block_size)
        worker = call("the worker side's constructor", connector, config,
                      KVConnectorRole.WORKER, layout.block_size)
        caches = [layout.noise(gen) for _ in range(layout.num_layers)]
        call("register_kv_caches", worker.register_kv_caches, caches)
        rng = random.Random(seed)
        free = list(range(layout.num_blocks))
        rng.shuffle(free)
        return cls(scheduler, worker, caches, layout, rng, free)

    def allocate(self, num_tokens: int, held: list[int] | None = None) -> list[int]:
        """A block table for ``num_tokens`` tokens: the ``held`` blocks, then free ones,
        random and out of order."""
        held = held or []
        count = -(-num_tokens // self.layout.block_size) - len(held)
        taken, self.free_blocks = self.free_blocks[:count], self.free_blocks[count:]
        return held + taken

    def step(self, output: SchedulerOutput,
             forward: Callable[[int], AttentionMetadata] | None = None) -> KVConnectorOutput:
        """Both sides of one step: the scheduler side's metadata, the worker side's calls
        around the forward pass (``forward(layer)`` computes one layer), the report back."""
        output.kv_connector_metadata = call("build_connector_meta",
                                            self.scheduler.build_connector_meta, output)
        return self.run_worker(output, forward)

    def run_worker(self, output: SchedulerOutput,
                   forward: Callable[[int], AttentionMetadata] | None = None,
                   ) -> KVConnectorOutput:
        worker = self.worker
        call("bind_connector_metadata", worker.bind_connector_metadata,
             output.kv_connector_metadata)
        call("start_load_kv", worker.start_load_kv)
        if forward is not None:  # an engine runs no forward pass when nothing is scheduled
            for layer in range(self.layout.num_layers):
                call("wait_for_layer_load", worker.wait_for_layer_load, layer)
                metadata = forward(layer)
                call("save_kv_layer", worker.save_kv_layer, layer, self.caches[layer],
                     metadata)
        call("wait_for_save", worker.wait_for_save)
        sending, recving = call("get_finished", worker.get_finished,
                                set(output.finished_req_ids))
        report = KVConnectorOutput(finished_sending=set(sending), finished_recving=set(recving),
                                   failed_recving=set(call("get_failed_loads",
                                                           worker.get_failed_loads)))
        call("update_connector_output", self.scheduler.update_connector_output, report)
        return report


def empty_step(finished_req_ids: set[str] | None = None) -> SchedulerOutput:
    return SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(),
                           num_scheduled_tokens={}, total_num_scheduled_tokens=0,
                           finished_req_ids=finished_req_ids or set())


def new_request(req_id: str, prompt: list[int]) -> Request:
    return Request(req_id, list(prompt), SamplingParams(max_tokens=1, temperature=0.0))


@dataclass
class Saved:
    """What a producer did with one prompt."""

    reported: bool  # get_finished reported the save
    kv: list[torch.Tensor]  # the prompt's K/V, per layer


def save_prompt(engine: Engine, req_id: str, prompt: list[int], gen: torch.Generator,
                timeout_s: float) -> Saved:
    """The producer computes ``prompt`` in one step and finishes the request; then steps
    until the worker reports the save (or ``timeout_s`` passes). Its blocks are then freed
    and reused: they get noise."""
    layout, num_tokens = engine.layout, len(prompt)
    request = new_request(req_id, prompt)
    # The scheduler asks about every new request; a producer learns of its prompts here.
    call("get_num_new_matched_tokens", engine.scheduler.get_num_new_matched_tokens, request, 0)
    block_ids = engine.allocate(num_tokens)
    kv = layout.prompt_kv(gen, num_tokens)
    request.num_computed_tokens, request.status = num_tokens, RequestStatus.RUNNING
    output = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData(req_id, list(prompt), request.sampling_params,
                                           block_ids, 0)],
        scheduled_cached_reqs=CachedRequestData(), num_scheduled_tokens={req_id: num_tokens},
        total_num_scheduled_tokens=num_tokens)
    metadata = prefill_metadata(layout, block_ids, num_tokens)

    def forward(layer: int) -> AttentionMetadata:
        layout.write(engine.caches[layer], block_ids, kv[layer])
        return metadata

    report = engine.step(output, forward)
    request.output_token_ids.append(0)
    request.status = RequestStatus.FINISHED_LENGTH
    call("request_finished", engine.scheduler.request_finished, request, block_ids)
    reported = req_id in report.finished_sending
    finished = {req_id}
    deadline = time.monotonic() + timeout_s
    while not reported and time.monotonic() < deadline:
        time.sleep(0.005)
        reported = req_id in engine.step(empty_step(finished)).finished_sending
        finished = set()
    for cache in engine.caches:
        cache[:, block_ids] = layout.noise(gen, len(block_ids))
    return Saved(reported, kv)


@dataclass
class Loaded:
    """What a consumer did with one prompt."""

    matched: int  # tokens its lookup found beyond the local prefix
    num_local: int  # tokens it had in its own prefix cache
    block_ids: list[int]
    before: list[torch.Tensor]  # the caches just before the load
    finished: bool = False  # get_finished reported the load
    failed: bool = False  # get_failed_loads reported it


def load_prompt(engine: Engine, req_id: str, prompt: list[int], local_kv: list[torch.Tensor],
                timeout_s: float, damage: Callable[[], None] | None = None) -> Loaded:
    """The consumer looks ``prompt`` up, holding its first ``local_kv[0].shape[1]`` tokens'
    K/V in its own prefix cache; when the connector matches tokens, the request gets blocks
    and waits while steps run until the worker reports the load. ``damage`` runs once the
    scheduler side planned the load, before the worker starts it."""
    layout = engine.layout
    num_local = local_kv[0].shape[1] if local_kv else 0
    request = new_request(req_id, prompt)
    local_blocks = engine.allocate(num_local)
    for cache, kv in zip(engine.caches, local_kv):
        layout.write(cache, local_blocks, kv)
    matched, _ = call("get_num_new_matched_tokens",
                      engine.scheduler.get_num_new_matched_tokens, request, num_local)
    if not matched:
        return Loaded(0, num_local, local_blocks, [])
    block_ids = engine.allocate(num_local + matched, held=local_blocks)
    request.num_computed_tokens = num_local
    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
    call("update_state_after_alloc", engine.scheduler.update_state_after_alloc, request,
         list(block_ids), matched)
    loaded = Loaded(int(matched), num_local, block_ids, [c.clone() for c in engine.caches])
    output = empty_step()
    output.kv_connector_metadata = call("build_connector_meta",
                                        engine.scheduler.build_connector_meta, output)
    if damage is not None:
        damage()
    report = engine.run_worker(output)
    deadline = time.monotonic() + timeout_s
    while True:
        loaded.finished |= req_id in report.finished_recving
        loaded.failed |= req_id in report.failed_recving
        if loaded.finished or time.monotonic() >= deadline:
            return loaded
        time.sleep(0.005)
        report = engine.step(empty_step())


def prefill_metadata(layout: CacheLayout, block_ids: list[int], num_tokens: int,
                     ) -> AttentionMetadata:
    """The attention metadata of a step computing one whole prompt."""
    device = layout.device
    starts = torch.tensor([0, num_tokens], dtype=torch.int32)
    seq_lens = torch.tensor([num_tokens], dtype=torch.int32)
    return AttentionMetadata(
        num_actual_tokens=num_tokens, num_reqs=1, query_start_loc=starts.to(device),
        seq_lens=seq_lens.to(device),
        block_tables=torch.tensor([block_ids], dtype=torch.int32, device=device),
        slot_mapping=layout.slots(block_ids, num_tokens), max_query_len=num_tokens,
        max_seq_len=num_tokens, query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)
