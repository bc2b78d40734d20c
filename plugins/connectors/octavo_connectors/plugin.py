"""Entry point of octavo-connectors: registers the KV connectors (Mooncake's own library is
imported only when a mooncake connector is built)."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import hookimpl
from octavo_connectors.mooncake import MooncakeConnector
from octavo_connectors.shared_storage import SharedStorageConnector

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"


@hookimpl
def octavo_register_kv_connectors(registry: Any) -> None:
    registry.register("shared_storage", SharedStorageConnector)
    registry.register("mooncake", MooncakeConnector)
