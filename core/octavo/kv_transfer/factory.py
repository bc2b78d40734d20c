"""Build a config's connector for one side of the engine (``None`` without a config)."""

from __future__ import annotations

from octavo.kv_transfer.base import KVConnector, KVConnectorRole
from octavo.kv_transfer.config import KVTransferConfig
from octavo.plugins import get_registries


def make_connector(config: KVTransferConfig | None, role: KVConnectorRole,
                   block_size: int) -> KVConnector | None:
    if config is None:
        return None
    connector_cls = get_registries().kv_connectors.get(config.connector)
    return connector_cls(config, role, block_size)
