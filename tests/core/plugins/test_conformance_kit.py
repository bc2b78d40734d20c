"""The conformance kit (octavo.testing) fails broken plugins, naming the contract they break:
a backend that reads blocks 0, 1, 2... instead of its block table, one that never writes the
new K/V into the cache, and a KV connector whose load raises. Each runs the kit's contract in
its own pytest session (pytester), as a plugin's test suite would."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# The kit's plugin by module name; "no:octavo" first, in case its entry point is installed.
KIT = ("-p", "no:octavo", "-p", "octavo.testing.plugin", "-p", "no:cacheprovider")

BROKEN_BACKENDS = '''
import dataclasses

import torch

from octavo.plugin_api import TorchAttentionBackend, TorchAttentionImpl
from octavo.testing import AttentionBackendContract


class InOrderImpl(TorchAttentionImpl):
    """Reads each request's blocks 0, 1, 2... whatever its block table says."""

    def forward(self, query, key, value, kv_cache, metadata):
        in_order = torch.arange(metadata.block_tables.shape[1], dtype=torch.int32)
        tables = in_order.expand_as(metadata.block_tables).contiguous()
        return super().forward(query, key, value, kv_cache,
                               dataclasses.replace(metadata, block_tables=tables))


class NoWriteImpl(TorchAttentionImpl):
    """Attends correctly, but writes the new K/V into a copy of the cache."""

    def forward(self, query, key, value, kv_cache, metadata):
        return super().forward(query, key, value, kv_cache.clone(), metadata)


class InOrderBackend(TorchAttentionBackend):
    name = "in-order"
    impl_cls = InOrderImpl


class NoWriteBackend(TorchAttentionBackend):
    name = "no-write"
    impl_cls = NoWriteImpl


class TestInOrder(AttentionBackendContract):
    backend = InOrderBackend


class TestNoWrite(AttentionBackendContract):
    backend = NoWriteBackend
'''


@pytest.fixture
def broken_backends(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_broken_backends=BROKEN_BACKENDS)
    return pytester


def run_kit(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[str, str]]:
    """A contract session in pytester's folder: test name -> (outcome, failure message)."""
    recorder = pytester.inline_run(*KIT, *args)
    return {report.nodeid.split("::", 1)[1]: (report.outcome, report.longreprtext)
            for report in recorder.getreports("pytest_runtest_logreport")
            if report.when == "call"}


def test_ignoring_the_block_table_breaks_the_block_table_contract(
        broken_backends: pytest.Pytester) -> None:
    got = run_kit(broken_backends, "-k", "TestInOrder and (single_request or block_table)")
    # Blocks in order, one request: the backend is right, and the kit says so.
    for kind in ("fresh prompt", "chunk", "decode"):
        assert got[f"TestInOrder::test_single_request[{kind}]"][0] == "passed", got
    # Out of order: only a request that reads the cache can tell (a fresh prompt does not).
    for kind in ("chunk", "decode"):
        outcome, message = got[f"TestInOrder::test_reads_through_the_block_table[{kind}]"]
        assert outcome == "failed", got
        assert message.startswith("attention contract 'reads K/V through the block table' "
                                  "broken (seed "), message
        assert "blocks out of order, noise in unused blocks" in message, message


def test_not_writing_the_cache_breaks_the_write_contract(
        broken_backends: pytest.Pytester) -> None:
    got = run_kit(broken_backends, "-k", "TestNoWrite and (writes or mixed_batch)")
    outcome, message = got.pop("TestNoWrite::test_writes_the_new_kv_into_their_slots")
    assert outcome == "failed", message
    assert message.startswith("attention contract 'writes the new K/V into their slots' "
                              "broken"), message
    assert "after forward, the keys of tokens [0, 1, 2" in message, message
    assert {outcome for outcome, _ in got.values()} == {"passed"}, got


def test_a_failure_replays_with_its_seed(broken_backends: pytest.Pytester) -> None:
    result = broken_backends.runpytest(*KIT, "--octavo-seed", "1234", "-k",
                                       "TestInOrder and block_table and decode")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["octavo conformance kit: plugin API *, replaying seed 1234",
                                 "*broken (seed 1234; rerun with --octavo-seed=1234)*"])


RAISING_CONNECTOR = '''
from octavo.plugin_api import KVTransferConfig
from octavo.testing import KVConnectorContract
from octavo_connectors.shared_storage import SharedStorageConnector


class RaisingLoads(SharedStorageConnector):
    """Lets a failed load's exception out of start_load_kv instead of reporting it."""

    def start_load_kv(self):
        for spec in self._metadata.loads:
            self._load(spec)
            self._finished_recving.add(spec.req_id)


class TestRaisingLoads(KVConnectorContract):
    connector = RaisingLoads

    def make_config(self, role, store):
        return KVTransferConfig("shared_storage", role, {"path": str(store)})
'''


@pytest.mark.needs_plugins
def test_a_load_that_raises_breaks_the_fallback_contract(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_raising_connector=RAISING_CONNECTOR)
    got = run_kit(pytester, "-k", "round_trip or corrupt")
    assert all(got[f"TestRaisingLoads::test_round_trip[{case}]"][0] == "passed"
               for case in ("block-aligned prompt", "ragged prompt", "local prefix hit")), got
    for when in ("before lookup", "after lookup"):
        outcome, message = got[f"TestRaisingLoads::test_damaged_store_falls_back[corrupt-{when}]"]
        assert outcome == "failed", got
        assert "KV connector contract 'never raises into the engine' broken" in message, message
        assert "start_load_kv raised SafetensorError" in message, message
        assert f"with the store corrupt {when}" in message, message
