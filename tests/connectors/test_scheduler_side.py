"""The scheduler's side of KV transfer, with the real scheduler and the shared-storage
connector's scheduler side (no model: the worker's report is plain data built here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octavo.block_hash import update_block_hashes
from octavo.config import KVTransferConfig
from octavo.distributed.state import RankInfo
from octavo.outputs import KVConnectorOutput, ModelRunnerOutput, SchedulerOutput
from octavo.request import Request, RequestStatus
from octavo.sampling_params import SamplingParams
from octavo.sched.scheduler import Scheduler
from octavo.testing.seeds import draw_seed
from octavo_connectors.prefix_store import done_blob
from octavo_connectors.shared_storage import DirectoryStore
from tests.core.scheduler_fakes import make_scheduler

BLOCK = 16
NUM_BLOCKS = 64


@pytest.fixture
def seed() -> int:
    return draw_seed()


def make_request(request_id: str, num_tokens: int, rng: np.random.Generator) -> Request:
    return Request(request_id, rng.integers(0, 1000, num_tokens).tolist(),
                   SamplingParams(max_tokens=4, temperature=0.0))


def consumer(store: Path) -> Scheduler:
    return make_scheduler(
        num_blocks=NUM_BLOCKS, max_model_len=256, block_size=BLOCK,
        kv_transfer=KVTransferConfig("shared_storage", "consumer", {"path": str(store)}))


def store_prefix(store: Path, request: Request) -> int:
    """Mark the request's loadable prefix as stored; its number of tokens."""
    num_blocks = (request.num_prompt_tokens - 1) // BLOCK
    key = update_block_hashes(request, BLOCK)[num_blocks - 1].hex()
    DirectoryStore(store).put(done_blob(key, RankInfo()), b"1")
    return num_blocks * BLOCK


def report(so: SchedulerOutput, **transfers: set[str]) -> ModelRunnerOutput:
    """The worker's answer to ``so``: one token per request that finished its prompt."""
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=[[7] for _ in ids],
                             kv_connector_output=KVConnectorOutput(**transfers))


def test_a_loading_request_waits_without_holding_up_others(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scheduler = consumer(tmp_path)
    stored, other = make_request("stored", int(rng.integers(40, 90)), rng), \
        make_request("other", 40, rng)
    num_loaded = store_prefix(tmp_path, stored)
    scheduler.add_request(stored)
    scheduler.add_request(other)

    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"other": 40}, seed
    assert stored.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    [load] = first.kv_connector_metadata.loads
    assert (load.req_id, load.first_block, len(load.block_ids)) == \
        ("stored", 0, num_loaded // BLOCK), seed

    scheduler.update_from_output(first, report(first, finished_recving={"stored"}))
    second = scheduler.schedule()
    [new] = second.scheduled_new_reqs
    assert (new.req_id, new.num_computed_tokens) == ("stored", num_loaded), seed
    assert new.block_ids[:len(load.block_ids)] == load.block_ids, seed
    assert second.num_scheduled_tokens["stored"] == stored.num_prompt_tokens - num_loaded
    stats = scheduler.make_stats().kv_transfer
    assert (stats.loads, stats.loaded_tokens, stored.num_cached_tokens) == \
        (1, num_loaded, num_loaded), seed


def test_a_failed_load_computes_the_whole_prompt(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scheduler = consumer(tmp_path)
    stored = make_request("stored", int(rng.integers(40, 90)), rng)
    store_prefix(tmp_path, stored)
    scheduler.add_request(stored)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {}, seed
    scheduler.update_from_output(first, report(first, finished_recving={"stored"},
                                               failed_recving={"stored"}))
    second = scheduler.schedule()
    assert second.scheduled_new_reqs[0].num_computed_tokens == 0, seed
    assert second.num_scheduled_tokens == {"stored": stored.num_prompt_tokens}, seed
    assert scheduler.make_stats().kv_transfer.failed_loads == 1


def test_aborting_a_loading_request_frees_its_blocks(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scheduler = consumer(tmp_path)
    stored = make_request("stored", int(rng.integers(40, 90)), rng)
    store_prefix(tmp_path, stored)
    scheduler.add_request(stored)
    first = scheduler.schedule()
    assert scheduler.kv_manager.num_free_blocks < NUM_BLOCKS
    scheduler.finish_requests("stored", RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv_manager.num_free_blocks == NUM_BLOCKS
    assert not scheduler.has_unfinished_requests()
    scheduler.update_from_output(first, report(first, finished_recving={"stored"}))
    assert scheduler.schedule().scheduled_new_reqs == []
