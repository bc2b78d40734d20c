"""``KVTransferConfig``: which connector moves KV between engines, and in which direction.

Given as JSON on the command line (``--kv-transfer-config '{"connector": "shared_storage",
"role": "producer", "path": "/tmp/kv"}'``) or as a dict / JSON string to
``LLM(kv_transfer_config=...)``. Keys other than ``connector`` and ``role`` belong to the
connector (its ``extra`` dict); vLLM's ``kv_connector`` / ``kv_role`` spellings are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("producer", "consumer", "both")
_ALIASES = {"kv_connector": "connector", "kv_role": "role",
            "kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}


@dataclass(frozen=True)
class KVTransferConfig:
    connector: str
    role: str = "both"  # producer: saves prompt KV; consumer: loads it; both: either
    extra: dict[str, Any] = field(default_factory=dict)  # the connector's own keys

    @property
    def is_producer(self) -> bool:
        return self.role in ("producer", "both")

    @property
    def is_consumer(self) -> bool:
        return self.role in ("consumer", "both")

    @classmethod
    def parse(cls, value: KVTransferConfig | dict[str, Any] | str) -> KVTransferConfig:
        """From the JSON text of ``--kv-transfer-config`` or a dict; raises ``ConfigError``
        naming what is wrong (bad JSON, unknown connector or role)."""
        from octavo.config import ConfigError
        from octavo.plugins import get_registries

        if isinstance(value, KVTransferConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"kv_transfer_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError("kv_transfer_config must be a JSON object, got "
                              f"{type(value).__name__}")
        keys = {_ALIASES.get(k, k): v for k, v in value.items()}
        connector = keys.pop("connector", None)
        role = _ALIASES.get(keys.get("role", "both"), keys.get("role", "both"))
        keys.pop("role", None)
        names = get_registries().kv_connectors.names()
        if connector not in names:
            available = ", ".join(names) or "none (install octavo-connectors)"
            raise ConfigError(f"kv_transfer_config: unknown connector {connector!r}; "
                              f"available: {available}")
        if role not in ROLES:
            raise ConfigError(f"kv_transfer_config: role must be one of {', '.join(ROLES)}; "
                              f"got {role!r}")
        return cls(connector=connector, role=role, extra=keys)
