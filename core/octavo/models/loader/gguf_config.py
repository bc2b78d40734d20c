"""An HF-style config.json dict synthesized from a GGUF's ``<arch>.*`` metadata.

Models are built from HF configs only, so a GGUF must look like one: this maps llama.cpp's
metadata keys onto the HF field names (and fills what GGUF leaves implicit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.gguf_metadata import GgufFile
from octavo.models.loader.gguf_names import GgufArchitecture

DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's value when rope.freq_base is absent
# What llama.cpp hard-codes for Gemma 3 (and HF's Gemma3TextConfig defaults to): every sixth
# layer global, the others local with RoPE base 10000.
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
# llama.cpp scales queries by head_dim ** -0.5, except in the 27B (the one with 62 layers),
# whose query_pre_attn_scalar is hidden_size / heads (168) as in its HF config.
GEMMA3_27B_LAYERS = 62
GEMMA2_27B_LAYERS = 46  # the same rule for Gemma 2 (its 27B: query_pre_attn_scalar 144)


def synthesize_hf_config(gguf: GgufFile, arch: GgufArchitecture) -> dict[str, Any]:
    prefix = gguf.architecture

    def key(name: str) -> str:
        return f"{prefix}.{name}"

    scaling = gguf.get(key("rope.scaling.type"), "none")
    if scaling not in arch.rope_scalings:
        raise ModelLoadError(f"{gguf.path}: RoPE scaling type {scaling!r} is not supported")
    rope_scaling = None if scaling == "none" else {
        "rope_type": "linear", "factor": gguf.require(key("rope.scaling.factor"))}
    hidden_size = _count(gguf, key("embedding_length"))
    num_heads = _count(gguf, key("attention.head_count"))
    head_dim = _count(gguf, key("attention.key_length"), hidden_size // num_heads)
    embedding = gguf.tensors.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{gguf.path}: GGUF has no token_embd.weight tensor")
    vocab_size = int(embedding.shape[1])
    declared_vocab = gguf.get(key("vocab_size"), vocab_size)
    if declared_vocab != vocab_size:
        raise ModelLoadError(f"{gguf.path}: GGUF metadata {key('vocab_size')!r}: "
                             f"{declared_vocab!r}, but token_embd.weight has {vocab_size} rows")
    config = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": hidden_size,
        "num_hidden_layers": gguf.require(key("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": gguf.get(key("attention.head_count_kv"), num_heads),
        "head_dim": head_dim,
        "partial_rotary_factor": _rotated_dims(gguf, key("rope.dimension_count"), head_dim)
        / head_dim,
        "intermediate_size": gguf.require(key("feed_forward_length")),
        # The embedding's row count, not tokenizer metadata: it is what the weights hold.
        "vocab_size": vocab_size,
        "rms_norm_eps": gguf.require(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": gguf.get(key("rope.freq_base"), DEFAULT_ROPE_THETA),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": gguf.require(key("context_length")),
        # llama.cpp writes output.weight only when it differs from the embedding.
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        # HF's attention_bias puts biases on q, k, v and o; Qwen2 (dense and MoE) has them
        # on q, k and v only (qkv_bias).
        "attention_bias": "blk.0.attn_output.bias" in gguf.tensors,
        "qkv_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "mlp_bias": False,
        "hidden_act": arch.hidden_act,
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_token_ids(gguf),
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id"),
        # Quantized tensors are dequantized to fp32.
        "torch_dtype": "float32",
    }
    fields = _ARCH_FIELDS.get(arch.model_type)
    if fields is not None:
        config.update(fields(gguf, key, config))
    return config


def _count(gguf: GgufFile, name: str, default: int | None = None) -> int:
    """A positive integer of the metadata (``default`` where it is absent and one is given):
    the sizes a config is derived from, checked before they are divided by."""
    value = gguf.get(name, default) if default is not None else gguf.require(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{gguf.path}: GGUF metadata {name!r}: must be a positive "
                             f"integer, got {value!r}")
    return value


def _rotated_dims(gguf: GgufFile, name: str, head_dim: int) -> int:
    """The dimensions of a head that RoPE rotates (all where the metadata says nothing):
    pairs of them, at most the head."""
    dims = _count(gguf, name, head_dim)
    if dims % 2 or dims > head_dim:
        raise ModelLoadError(f"{gguf.path}: GGUF metadata {name!r}: {dims} must be even and "
                             f"at most the head's {head_dim} dimensions")
    return dims


def _gemma3_fields(gguf: GgufFile, key: Callable[[str], str], config: dict[str, Any],
                   ) -> dict[str, Any]:
    """Gemma 3's own config fields: the window is in the metadata, the rest is llama.cpp's
    fixed choice for the architecture (HF's GGUF loader takes its config defaults instead,
    the same values but for the 27B's query scale: 256 for every size)."""
    layers = range(config["num_hidden_layers"])
    query_scalar = (config["hidden_size"] // config["num_attention_heads"]
                    if config["num_hidden_layers"] == GEMMA3_27B_LAYERS else config["head_dim"])
    return {
        "hidden_activation": config["hidden_act"],  # the name HF's Gemma 3 config reads
        "sliding_window": gguf.require(key("attention.sliding_window")),
        "layer_types": ["full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0
                        else "sliding_attention" for i in layers],
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
        "query_pre_attn_scalar": query_scalar,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": gguf.get(key("final_logit_softcapping")),
    }


def _gemma2_fields(gguf: GgufFile, key: Callable[[str], str], config: dict[str, Any],
                   ) -> dict[str, Any]:
    """Gemma 2's: the window and both soft caps are in the metadata; every other layer
    local, the first one (llama.cpp's and HF's pattern); queries scaled as llama.cpp does."""
    query_scalar = (config["hidden_size"] // config["num_attention_heads"]
                    if config["num_hidden_layers"] == GEMMA2_27B_LAYERS else config["head_dim"])
    return {
        "hidden_activation": config["hidden_act"],
        "sliding_window": gguf.require(key("attention.sliding_window")),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(config["num_hidden_layers"])],
        "query_pre_attn_scalar": query_scalar,
        "attn_logit_softcapping": gguf.get(key("attn_logit_softcapping")),
        "final_logit_softcapping": gguf.get(key("final_logit_softcapping")),
    }


def _phi3_fields(gguf: GgufFile, key: Callable[[str], str], config: dict[str, Any],
                 ) -> dict[str, Any]:
    """Phi-3's: LongRoPE where llama.cpp wrote its factors as tensors (with the original
    context and the attention factor in the metadata), the window (0: none)."""
    fields: dict[str, Any] = {
        "sliding_window": gguf.get(key("attention.sliding_window")) or None,
    }
    factors = {name: gguf.tensors.get(f"rope_factors_{name}.weight") for name in ("long", "short")}
    if factors["long"] is not None and factors["short"] is not None:
        fields["original_max_position_embeddings"] = gguf.require(
            key("rope.scaling.original_context_length"))
        fields["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": [float(v) for v in factors["long"].data],
            "short_factor": [float(v) for v in factors["short"].data],
            "attention_factor": gguf.get(key("rope.scaling.attn_factor")),
        }
    return fields


def _moe_fields(gguf: GgufFile, key: Callable[[str], str], config: dict[str, Any],
                ) -> dict[str, Any]:
    """Qwen2-MoE's and Qwen3-MoE's: every layer sparse (llama.cpp converts no other), the
    experts' sizes; the top-k weights renormalised in Qwen3-MoE only, as llama.cpp computes
    them; Qwen2-MoE's shared expert."""
    fields = {
        "num_experts": gguf.require(key("expert_count")),
        "num_experts_per_tok": gguf.require(key("expert_used_count")),
        "moe_intermediate_size": gguf.require(key("expert_feed_forward_length")),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": config["model_type"] == "qwen3_moe",
    }
    shared = gguf.get(key("expert_shared_feed_forward_length"))
    if shared:
        fields["shared_expert_intermediate_size"] = shared
    return fields


_ARCH_FIELDS: dict[str, Callable[[GgufFile, Callable[[str], str], dict[str, Any]],
                                 dict[str, Any]]] = {
    "gemma3_text": _gemma3_fields,
    "gemma2": _gemma2_fields,
    "phi3": _phi3_fields,
    "qwen2_moe": _moe_fields,
    "qwen3_moe": _moe_fields,
}


def _eos_token_ids(gguf: GgufFile) -> int | list[int] | None:
    """llama.cpp's end-of-generation ids: EOS, and end-of-turn / end-of-message where the
    file names them (Llama 3 Instruct ends a turn with <|eot_id|>, not its EOS); one id as
    an int, several as HF writes them, a list."""
    ids = [gguf.get(f"tokenizer.ggml.{kind}_token_id") for kind in ("eos", "eot", "eom")]
    unique = list(dict.fromkeys(i for i in ids if i is not None))
    if not unique:
        return None
    return unique[0] if len(unique) == 1 else unique
