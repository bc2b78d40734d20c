"""``check_config_ranges``: every number of a model's HF-style config that sizes a tensor or
enters the arithmetic, checked against a range before anything is built from it.

A config.json (or a GGUF's metadata, synthesized into one) is input like any other: a
``num_hidden_layers`` of 1e9 or a ``vocab_size`` of 2**40 would otherwise be built (and
allocated) as given, a ``head_count`` of 0 divide by zero, a ``rope_theta`` of -1 or an
``rms_norm_eps`` of NaN turn every output into NaN. The bounds are far beyond any released
model (the largest vocabulary is ~262k, the deepest model ~126 layers, the longest context
~10M tokens) and small enough that nothing sized by them can overflow. Every loader calls
this as soon as it has the config, and ``ArchConfig.from_hf`` calls it again, so no path
builds a model from an unchecked one.
"""

from __future__ import annotations

import math
from typing import Any

from octavo.models.loader.errors import ModelLoadError

_K = 1 << 10
_M = 1 << 20
# Integer fields: (least, most) allowed. A field left out or null is not checked here.
INT_RANGES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 16 * _M),
    "hidden_size": (1, 128 * _K),
    "intermediate_size": (1, _M),
    "num_hidden_layers": (1, 4 * _K),
    "num_attention_heads": (1, 4 * _K),
    "num_key_value_heads": (1, 4 * _K),
    "head_dim": (1, 4 * _K),
    "max_position_embeddings": (1, 16 * _M),
    "original_max_position_embeddings": (1, 16 * _M),
    "sliding_window": (0, 16 * _M),  # Qwen writes 0 with use_sliding_window false
    "type_vocab_size": (0, 64 * _K),
    "num_experts": (0, 4 * _K),
    "num_local_experts": (0, 4 * _K),
    "n_routed_experts": (0, 4 * _K),
    "num_experts_per_tok": (0, 4 * _K),
    "n_shared_experts": (0, 256),
    "moe_intermediate_size": (0, _M),
    "shared_expert_intermediate_size": (0, _M),
    "first_k_dense_replace": (0, 4 * _K),
    "decoder_sparse_step": (1, 4 * _K),
    "n_group": (1, 4 * _K),
    "topk_group": (1, 4 * _K),
    "kv_lora_rank": (1, 64 * _K),
    "q_lora_rank": (1, 64 * _K),
    "qk_nope_head_dim": (1, 4 * _K),
    "qk_rope_head_dim": (1, 4 * _K),
    "v_head_dim": (1, 4 * _K),
    "mamba_d_state": (1, 4 * _K),
    "mamba_d_conv": (1, 256),
    "mamba_expand": (1, 64),
    "attn_layer_period": (1, 4 * _K),
    "expert_layer_period": (1, 4 * _K),
}
# Float fields: (lowest, highest); a value must be finite and lowest < value <= highest.
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rope_theta": (0.0, 1e15),
    "rope_local_base_freq": (0.0, 1e15),
    "rms_norm_eps": (0.0, 1.0),
    "layer_norm_eps": (0.0, 1.0),
    "partial_rotary_factor": (0.0, 1.0),
    "query_pre_attn_scalar": (0.0, 1e9),
    "attn_logit_softcapping": (0.0, 1e9),
    "final_logit_softcapping": (0.0, 1e9),
    "routed_scaling_factor": (0.0, 1e9),
}
# The same for the entries of a RoPE scaling (``rope_scaling`` / ``rope_parameters``).
ROPE_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rope_theta": FLOAT_RANGES["rope_theta"],
    "factor": (0.0, 1e6),
    "partial_rotary_factor": (0.0, 1.0),
}
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def check_config_ranges(hf_config: dict[str, Any], source: object) -> None:
    """Raise ``ModelLoadError`` naming ``source``, the field, its value and its range, for
    the first number of ``hf_config`` that is of the wrong type or out of range."""
    for key, (low, high) in INT_RANGES.items():
        _check_int(hf_config.get(key), key, low, high, source)
    for key, (low_f, high_f) in FLOAT_RANGES.items():
        _check_float(hf_config.get(key), key, low_f, high_f, source)
    for key in ROPE_KEYS:
        for name, params in _rope_entries(hf_config.get(key), key):
            for field, (low_f, high_f) in ROPE_FLOAT_RANGES.items():
                _check_float(params.get(field), f"{name}.{field}", low_f, high_f, source)
            _check_int(params.get("original_max_position_embeddings"),
                       f"{name}.original_max_position_embeddings",
                       *INT_RANGES["original_max_position_embeddings"], source)


def _rope_entries(value: Any, key: str) -> list[tuple[str, dict[str, Any]]]:
    """The RoPE parameter dicts under ``key``: one, or one per layer type (Gemma 3)."""
    if not isinstance(value, dict):
        return []
    nested = [(f"{key}.{name}", params) for name, params in value.items()
              if isinstance(params, dict)]
    return nested or [(key, value)]


def _check_int(value: Any, key: str, low: int, high: int, source: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{source}: config field {key!r}: must be an integer in "
                             f"{low}..{high}, got {value!r}")
    if not low <= value <= high:
        raise ModelLoadError(f"{source}: config field {key!r}: {value} is out of range "
                             f"{low}..{high}")


def _check_float(value: Any, key: str, low: float, high: float, source: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelLoadError(f"{source}: config field {key!r}: must be a number in "
                             f"({low:g}, {high:g}], got {value!r}")
    if not (math.isfinite(value) and low < value <= high):
        raise ModelLoadError(f"{source}: config field {key!r}: {value!r} is out of range "
                             f"({low:g}, {high:g}]")
