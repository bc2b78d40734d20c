"""The KV-connector conformance contract (octavo.testing) against the shipped connectors:
shared_storage on files in a temporary directory, mooncake on a real mooncake_master (the
round trip only: its store's failures are test_mooncake.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.plugin_api import KVTransferConfig
from octavo.testing import KVConnectorContract
from octavo_connectors import mooncake
from octavo_connectors.mooncake import MooncakeConnector
from octavo_connectors.shared_storage import SharedStorageConnector

from .conftest import MooncakeMaster, start_mooncake_master


class TestSharedStorage(KVConnectorContract):
    connector = SharedStorageConnector

    def make_config(self, role: str, store: Path) -> KVTransferConfig:
        return KVTransferConfig("shared_storage", role, {"path": str(store)})


@pytest.fixture(scope="class")
def shared_master() -> Iterator[MooncakeMaster]:
    """One master for the class: closing a client and stopping its master cost seconds, too
    much to pay per test (the conftest's ``mooncake_master``). Its objects' leases last 100
    ms, not 5 s: closing a client waits for its objects' leases."""
    master = start_mooncake_master("--default_kv_lease_ttl=100")
    try:
        yield master
    finally:
        close_clients(master)
        master.stop()


def close_clients(master: MooncakeMaster) -> None:
    """Close this process's store clients of ``master`` while it runs: left open, a client
    whose master is gone retries for many seconds when the process exits."""
    for settings, client in list(mooncake._clients.items()):
        if settings[-1] == master.address:
            client.close()
            del mooncake._clients[settings]


class TestMooncake(KVConnectorContract):
    connector = MooncakeConnector

    @pytest.fixture(autouse=True)
    def master(self, shared_master: MooncakeMaster) -> MooncakeMaster:
        self._master = shared_master
        return shared_master

    def make_config(self, role: str, store: Path) -> KVTransferConfig:
        return KVTransferConfig.parse(self._master.kv_config(role))

    def damage_store(self, store: Path, damage: str) -> None:
        pytest.skip("the entries live in the engines' Mooncake segments, and a client whose "
                    "master is stopped takes many seconds to close: test_mooncake.py covers the "
                    "master's loss, with engines in processes of their own")
