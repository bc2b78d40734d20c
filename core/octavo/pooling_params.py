"""``PoolingParams``: what one pooling request (an embedding) asks for, vLLM's names.

Plain data that travels inside the request. The worker pools the prompt's hidden states
the model's one way (``PoolerConfig.pooling_type``) and sends back the raw vector; these
settings are applied to it in the front end (``octavo.engine.output_processor``): keep the
first ``dimensions`` entries (Matryoshka models), then L2-normalise when
``use_activation``. The ``Processor`` fills every ``None`` from the model's pooler config,
so the engine gets the settings it will use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PoolingParams:
    dimensions: int | None = None  # keep the first N dimensions; None: all of them
    use_activation: bool | None = None  # L2-normalise; None: the model's setting

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool)
                                            or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise ValueError(f"use_activation must be a bool, got {self.use_activation!r}")


def check_dimensions(dimensions: int, hf_config: dict[str, Any]) -> None:
    """``dimensions`` may shorten a Matryoshka model's embeddings only (its config.json has
    ``is_matryoshka`` or ``matryoshka_dimensions``, as vLLM reads them), to a size it was
    trained for; ``ValueError`` says why not otherwise."""
    hidden_size = hf_config.get("hidden_size")
    sizes = hf_config.get("matryoshka_dimensions")
    if not (hf_config.get("is_matryoshka") or sizes):
        raise ValueError("dimensions: this model does not support Matryoshka representations "
                         "(its config.json has no is_matryoshka or matryoshka_dimensions); "
                         "a shortened embedding would be a poor one")
    if sizes and dimensions not in sizes:
        raise ValueError(f"dimensions: this model supports {sorted(sizes)} only, "
                         f"got {dimensions}")
    if isinstance(hidden_size, int) and dimensions > hidden_size:
        raise ValueError(f"dimensions: at most the model's hidden size {hidden_size}, "
                         f"got {dimensions}")
