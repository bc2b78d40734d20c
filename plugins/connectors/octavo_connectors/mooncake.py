"""``mooncake``: prompt KV in a Mooncake distributed store, over TCP.

``{"connector": "mooncake", "master_server_address": "127.0.0.1:50051",
"metadata_server": "http://127.0.0.1:8080/metadata"}`` - a running ``mooncake_master``
(started with ``--enable_http_metadata_server=true`` for the metadata URL above). Every
engine process joins the store as a client and lends it ``global_segment_size`` bytes of
its memory: what a producer puts lives in the segments of the clients alive at that time,
so a producer's KV outlives it only where other clients hold it.

Blobs are copied in and out (``put``/``get`` of bytes); registering the KV cache for
zero-copy transfers would need the cache to live in memory the store allocates.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from octavo.plugin_api import ConfigError
from octavo_connectors.prefix_store import BlobStore, PrefixStoreConnector

DEFAULTS: dict[str, Any] = {
    "local_hostname": "127.0.0.1",
    "metadata_server": "P2PHANDSHAKE",
    "protocol": "tcp",
    "device_name": "",
    "global_segment_size": 512 * 2**20,
    "local_buffer_size": 128 * 2**20,
}

logger = logging.getLogger(__name__)

# After the store fails to answer, lookups report "not stored" for this long without asking
# it: with the master gone each call would retry for seconds, and the prompt computed here
# is the right answer anyway.
RETRY_AFTER_S = 30.0

# One client per process and master: the scheduler side and the worker side of an engine
# share it (a second client in the same process would lend the store a second segment).
_clients: dict[tuple[Any, ...], Any] = {}


class MooncakeStore(BlobStore):
    def __init__(self, options: dict[str, Any]) -> None:
        from mooncake.store import MooncakeDistributedStore

        settings = (options["local_hostname"], options["metadata_server"],
                    int(options["global_segment_size"]), int(options["local_buffer_size"]),
                    options["protocol"], options["device_name"],
                    options["master_server_address"])
        client = _clients.get(settings)
        if client is None:
            client = MooncakeDistributedStore()
            if client.setup(*settings) != 0:
                raise ConnectionError(f"cannot join the Mooncake store of the master at "
                                      f"{options['master_server_address']} (metadata "
                                      f"{options['metadata_server']}); is mooncake_master up?")
            _clients[settings] = client
        self.client = client
        self._unreachable_until = 0.0

    def exists(self, name: str) -> bool:
        if time.monotonic() < self._unreachable_until:
            return False
        code = self.client.is_exist(name)
        if code < 0:
            logger.warning("the Mooncake store does not answer (code %d); computing prompts "
                           "locally for the next %.0f s", code, RETRY_AFTER_S)
            self._unreachable_until = time.monotonic() + RETRY_AFTER_S
        return code == 1

    def put(self, name: str, data: bytes) -> None:
        code = self.client.put(name, data)
        if code != 0:
            raise OSError(f"Mooncake put of {name!r} failed with code {code}")

    def get(self, name: str) -> bytes:
        data = self.client.get(name)
        if not data:
            raise KeyError(f"Mooncake store has no {name!r}")
        return data


class MooncakeConnector(PrefixStoreConnector):
    def make_store(self) -> BlobStore:
        options = {**DEFAULTS, **self.config.extra}
        if "master_server_address" not in options:
            raise ConfigError('kv_transfer_config: the mooncake connector needs '
                              '"master_server_address" (host:port of mooncake_master)')
        return MooncakeStore(options)
