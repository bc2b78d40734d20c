"""``PoolerConfig``: ``--pooler-config '{"pooling_type": "MEAN", ...}'`` (vLLM's keys).

How a pooling model (``--runner pooling``) turns a prompt's hidden states into one vector:
``pooling_type`` (``CLS``: the first token's, ``MEAN``: the average over every token,
``LAST``: the last token's), ``use_activation`` (vLLM's name since it retired
``normalize``: for embeddings, L2-normalise the vector) and ``dimensions`` (keep only the
first N of a Matryoshka model's dimensions). A key left out takes the model's own setting:
a sentence-transformers folder's ``modules.json`` and ``1_Pooling/config.json``, else CLS
for encoders and LAST for decoders, normalised (``octavo.models.pooling_setup``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.config.errors import ConfigError
from octavo.config.parse import check_known_keys, check_positive_ints, parse_json_object

POOLING_TYPES = ("CLS", "LAST", "MEAN")


@dataclass
class PoolerConfig:
    pooling_type: str | None = None  # one of POOLING_TYPES; None: the model's
    use_activation: bool | None = None  # normalise embeddings; None: the model's
    dimensions: int | None = None  # the default output size (Matryoshka models only)

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ConfigError(f"pooler_config: pooling_type must be one of "
                              f"{', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise ConfigError(f"pooler_config: use_activation must be true or false, "
                              f"got {self.use_activation!r}")
        if self.dimensions is not None:
            try:
                check_positive_ints("", dimensions=self.dimensions)
            except ConfigError as exc:
                raise ConfigError(f"pooler_config: {exc}") from None

    @classmethod
    def parse(cls, value: str | dict[str, Any] | PoolerConfig | None) -> PoolerConfig:
        """From JSON text, a dict or an instance; ``None`` (or empty text): the model's own."""
        if isinstance(value, PoolerConfig):
            return value
        if value is None or (isinstance(value, str) and not value.strip()):
            return cls()
        keys = parse_json_object(value, "pooler_config")
        check_known_keys(keys, cls, "pooler_config")
        return cls(**keys)
