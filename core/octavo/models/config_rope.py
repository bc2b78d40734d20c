"""``RopeConfig``: a model's rotary embedding as its HF config describes it - the base, the
scaling type and that type's parameters (``rope_parameters`` in transformers 5, per layer
type for Gemma 3; older files ``rope_theta`` + ``rope_scaling``) - and ``context_length``,
the longest sequence a scaling stretches the model to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.models.config_reader import ConfigReader

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")
# Older names HF configs still carry: Phi-3's first long-context files said "su".
ROPE_TYPE_ALIASES = {"su": "longrope"}
# RoPE scalings whose frequencies depend on the length of the sequence (HF recomputes them
# from the longest position of each forward pass): see ``RopeConfig.length_dependent``.
LENGTH_DEPENDENT_ROPE_TYPES = ("longrope", "dynamic")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; ``rope_type`` is one of ``SUPPORTED_ROPE_TYPES``, the
    other fields HF's ``rope_parameters`` of that name (``octavo.models.layers.rotary`` says
    what each scaling does with them)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only: the frequency band that is smoothly interpolated.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # The pre-training context (llama3, yarn, longrope); dynamic scales past max_position.
    original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 8192
    # The share of each head that is rotated (its first dims); the rest passes unrotated.
    partial_rotary_factor: float = 1.0
    # yarn and longrope: what cos/sin are multiplied by (None: derived from the factor).
    attention_factor: float | None = None
    # yarn: the ramp between extrapolated and interpolated frequencies, DeepSeek's mscales.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # longrope: per-frequency divisors up to (short) and past (long) the original context.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    @property
    def length_dependent(self) -> bool:
        """Whether a token's frequencies depend on its sequence's length (longrope, dynamic):
        the model then needs each token's ``AttentionMetadata.rope_lengths``."""
        return self.rope_type in LENGTH_DEPENDENT_ROPE_TYPES


def read_ropes(reader: ConfigReader) -> tuple[RopeConfig, RopeConfig | None]:
    """The RoPE of the model (of its full-attention layers) and that of its sliding-window
    layers where they have their own (None otherwise).

    transformers 5 writes Gemma 3's ``rope_parameters`` per layer type (``full_attention``,
    ``sliding_attention``); older Gemma 3 files give the local base as
    ``rope_local_base_freq``, ``rope_theta`` + ``rope_scaling`` being the global layers'.
    """
    params = reader.raw.get("rope_parameters")
    if isinstance(params, dict) and {"full_attention", "sliding_attention"} & params.keys():
        local = params.get("sliding_attention")
        return (_rope(reader, "rope_parameters", params.get("full_attention") or {}),
                None if local is None else _rope(reader, "rope_parameters", local))
    key = "rope_parameters" if params else "rope_scaling"
    rope = _rope(reader, key, reader.optional(key, {}))
    local_theta = reader.optional_float("rope_local_base_freq")
    local = None if local_theta is None else _rope(reader, "rope_local_base_freq",
                                                    {"rope_theta": local_theta})
    return rope, local


def _rope(reader: ConfigReader, key: str, params: dict[str, Any]) -> RopeConfig:
    """One RoPE from its parameters ``params`` (found under ``key``): a ``rope_parameters``
    entry (transformers 5) or ``rope_scaling`` with the config's ``rope_theta``. Defaults
    are HF's (``RotaryEmbeddingConfigMixin.standardize_rope_params`` and the scalings'
    functions), including that a top-level ``original_max_position_embeddings`` (Phi-3
    writes one) wins over the one in the parameters."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise reader.error(key, f"rope type {rope_type!r} is not supported "
                                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    max_position = int(reader.optional("max_position_embeddings", 8192))
    original = reader.raw.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings") or max_position
    factor = params.get("factor")
    if factor is None and rope_type in ("yarn", "longrope"):  # Phi-3, DeepSeek-V3
        factor = max_position / original
    partial = params.get("partial_rotary_factor",
                         reader.optional("partial_rotary_factor", 1.0))
    if not 0.0 < float(partial) <= 1.0:
        raise reader.error("partial_rotary_factor", f"must be in (0, 1], got {partial!r}")
    theta = params.get("rope_theta", reader.optional("rope_theta", RopeConfig.theta))
    fields = {name: params[name] for name in (
        "low_freq_factor", "high_freq_factor", "attention_factor", "mscale", "mscale_all_dim",
        "truncate") if params.get(name) is not None}
    # HF reads "beta_fast or 32": a null or 0 takes the default.
    fields.update({name: float(params[name]) for name in ("beta_fast", "beta_slow")
                   if params.get(name)})
    if rope_type == "longrope":
        fields.update(_longrope_factors(reader, key, params))
    return RopeConfig(theta=float(theta), rope_type=rope_type,
                      factor=float(1.0 if factor is None else factor),
                      original_max_position_embeddings=int(original),
                      max_position_embeddings=max_position,
                      partial_rotary_factor=float(partial), **fields)


def _longrope_factors(reader: ConfigReader, key: str, params: dict[str, Any],
                      ) -> dict[str, tuple[float, ...]]:
    """longrope's short and long factors: one number per rotated frequency each."""
    factors = {}
    for name in ("short_factor", "long_factor"):
        values = params.get(name)
        if not isinstance(values, list) or not values:
            raise reader.error(key, f"longrope needs a list {name!r}, got {values!r}")
        factors[name] = tuple(float(value) for value in values)
    if len(factors["short_factor"]) != len(factors["long_factor"]):
        raise reader.error(key, "longrope's short_factor and long_factor differ in length")
    return factors


def context_length(hf_config: dict[str, Any]) -> int:
    """The longest sequence the model takes: ``max_position_embeddings``, stretched by a
    RoPE scaling that reaches past it at run time (vLLM's rule: ``dynamic`` by its factor,
    ``yarn`` to its original context times its factor)."""
    length = int(hf_config.get("max_position_embeddings", 2048))
    params = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    factor = params.get("factor") if isinstance(params, dict) else None
    if rope_type == "dynamic" and factor:
        return int(length * factor)
    if rope_type == "yarn" and factor and params.get("original_max_position_embeddings"):
        return int(params["original_max_position_embeddings"] * factor)
    return length
