"""KV transfer between engines (disaggregated prefill/decode): the two-sided ``KVConnector``
interface. Its config is ``octavo.config.kv_transfer``; the scheduler side's glue is
``octavo.sched.kv_transfer``, the worker side's ``octavo.worker.kv_transfer``. Connectors
themselves live in plugins (``octavo-connectors``). Imports attention (for the metadata a
worker-side save reads) and the plain data."""

from octavo.kv_transfer.base import KVConnector, KVConnectorRole

__all__ = ["KVConnector", "KVConnectorRole"]
