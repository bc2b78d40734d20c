"""``KVTransferConfig``: which connector moves KV between engines, and in which direction.

Given as JSON on the command line (``--kv-transfer-config '{"connector": "shared_storage",
"role": "producer", "path": "/tmp/kv"}'``) or as a dict / JSON string to
``LLM(kv_transfer_config=...)``. Keys other than ``connector`` and ``role`` belong to the
connector (its ``extra`` dict); vLLM's ``kv_connector`` / ``kv_role`` spellings are accepted.
Whether the connector exists is checked when the engine is built, against the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.config.errors import ConfigError
from octavo.config.parse import parse_json_object

ROLES = ("producer", "consumer", "both")
_ALIASES = {"kv_connector": "connector", "kv_role": "role",
            "kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}


@dataclass(frozen=True)
class KVTransferConfig:
    connector: str
    role: str = "both"  # producer: saves prompt KV; consumer: loads it; both: either
    extra: dict[str, Any] = field(default_factory=dict)  # the connector's own keys

    def __post_init__(self) -> None:
        if not isinstance(self.connector, str) or not self.connector:
            raise ConfigError(f"kv_transfer_config: \"connector\" must name a connector, "
                              f"got {self.connector!r}")
        if self.role not in ROLES:
            raise ConfigError(f"kv_transfer_config: role must be one of {', '.join(ROLES)}; "
                              f"got {self.role!r}")

    @property
    def is_producer(self) -> bool:
        return self.role in ("producer", "both")

    @property
    def is_consumer(self) -> bool:
        return self.role in ("consumer", "both")

    @classmethod
    def parse(cls, value: KVTransferConfig | dict[str, Any] | str | None,
              ) -> KVTransferConfig | None:
        """From the JSON text of ``--kv-transfer-config`` or a dict; ``None`` means off."""
        if value is None or isinstance(value, KVTransferConfig):
            return value
        keys = {_ALIASES.get(k, k): v for k, v in
                parse_json_object(value, "kv_transfer_config").items()}
        connector = keys.pop("connector", None)
        role = keys.pop("role", "both")
        return cls(connector=connector, role=_ALIASES.get(role, role), extra=keys)
