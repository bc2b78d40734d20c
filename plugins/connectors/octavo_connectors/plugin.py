"""Entry point of octavo-connectors: registers the KV connectors. Their modules (torch,
safetensors; Mooncake's own library only when a mooncake connector is built) are imported
inside the hook, so a process that only lists plugins imports none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.plugin_api import Registry, hookimpl

if TYPE_CHECKING:
    from octavo.plugin_api import KVConnector

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"


@hookimpl
def octavo_register_kv_connectors(registry: Registry[type[KVConnector]]) -> None:
    from octavo_connectors.mooncake import MooncakeConnector
    from octavo_connectors.shared_storage import SharedStorageConnector

    registry.register("shared_storage", SharedStorageConnector)
    registry.register("mooncake", MooncakeConnector)
