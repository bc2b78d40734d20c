"""KV transfer between engines (disaggregated prefill/decode): the two-sided ``KVConnector``
interface, its config, and the glue that calls it from the scheduler and the model runner.
Connectors themselves live in plugins (``octavo-connectors``)."""

from octavo.kv_transfer.base import KVConnector, KVConnectorRole
from octavo.kv_transfer.config import KVTransferConfig

__all__ = ["KVConnector", "KVConnectorRole", "KVTransferConfig"]
