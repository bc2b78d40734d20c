"""``ArchConfig``: a typed view of an HF ``config.json`` dict for the models of this package.

HF configs come in several dialects (transformers 5 writes ``rope_parameters``, per layer type
for Gemma 3, older files ``rope_theta`` + ``rope_scaling``; Qwen marks sliding-window layers
differently from Mistral, Gemma 3 with ``layer_types`` or ``sliding_window_pattern``).
Reading them once here, with errors that name the field, keeps the models free of dict lookups.
The RoPE (``config_rope``), the mixture of experts and latent attention (``config_parts``) are
read in modules of their own, through the same ``ConfigReader``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.models.config_parts import (
    MambaConfig,
    MLAConfig,
    MoEConfig,
    read_mamba,
    read_mla,
    read_moe,
)
from octavo.models.config_reader import ConfigReader
from octavo.models.config_rope import RopeConfig, read_ropes
from octavo.models.generation_config import GenerationConfig, read_generation_config
from octavo.models.loader import ModelFiles, ModelLoadError
from octavo.models.loader.config_ranges import check_config_ranges

SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
# Model types whose positions are learned embeddings, not RoPE (their heads may be odd).
ABSOLUTE_POSITIONS = ("bert",)
# What HF's config classes assume for keys a config.json may leave out, where it matters and
# differs from the Llama family's defaults below (transformers' Gemma3TextConfig).
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256, "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0, "sliding_window": 4096, "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
    },
    # Qwen's MoE configs (and HF's classes) leave the top-k weights as they are by default.
    "qwen2_moe": {"norm_topk_prob": False, "qkv_bias": True, "decoder_sparse_step": 1},
    "qwen3_moe": {"norm_topk_prob": False, "decoder_sparse_step": 1},
    # Phi3Config's pre-training context, which its longrope reads.
    "phi3": {"original_max_position_embeddings": 4096},
    # Gemma2Config: every other layer local (the first one), both kinds soft-capped.
    "gemma2": {
        "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256, "sliding_window": 4096,
        "sliding_window_pattern": 2, "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
    },
}


@dataclass(frozen=True)
class ArchConfig:
    """The fields of an HF config that the Llama-family, Mixtral, Gemma 3 and BERT models
    read."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    # Per layer: the attention window in tokens (a token sees itself and the window - 1
    # tokens before it, as HF's sliding-window mask), or None for full attention.
    sliding_windows: tuple[int | None, ...]
    # Mixture of experts (None: a dense model); num_experts == 0 for dense models.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe: MoEConfig | None = None
    hidden_act: str = "silu"
    # Qwen2-MoE's q/k/v biases (its config says qkv_bias, o_proj has none).
    qkv_bias: bool = False
    # Multi-head latent attention (None: q/k/v heads). ``head_dim`` is then its rotated
    # key part, as HF's DeepSeek config sets it.
    mla: MLAConfig | None = None
    # Mamba layers between the attention ones (Jamba); None: every layer attends.
    mamba: MambaConfig | None = None
    # The sliding-window layers' own RoPE where it differs from ``rope`` (Gemma 3's local
    # base frequency); None: every layer uses ``rope``.
    local_rope: RopeConfig | None = None
    # Gemma: queries are scaled by query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5),
    # attention scores and final logits soft-capped as cap * tanh(x / cap) (None: not).
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # BERT: LayerNorm's epsilon, the rows of the absolute position and token-type
    # embeddings (0 where a config has none).
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 0
    type_vocab_size: int = 0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], source: str | Path = "config.json") -> ArchConfig:
        """Read ``hf_config``; errors are ``ModelLoadError`` naming ``source`` and the field."""
        model_type = hf_config.get("model_type")
        if model_type is not None and not isinstance(model_type, str):
            raise ModelLoadError(f"{source}: config field 'model_type': must be a string, got "
                                 f"{model_type!r}")
        defaults = MODEL_TYPE_DEFAULTS.get(model_type or "", {})
        check_config_ranges({**defaults, **hf_config}, source)
        reader = ConfigReader({**defaults, **hf_config}, str(source))
        hidden_size = reader.positive_int("hidden_size")
        num_heads = reader.positive_int("num_attention_heads")
        num_layers = reader.positive_int("num_hidden_layers")
        # Gemma's configs name it hidden_activation (its HF modelling reads only that).
        act_key = "hidden_activation" if reader.optional("hidden_activation", None) else \
            "hidden_act"
        activation = reader.optional(act_key, "silu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise reader.error(act_key, f"{activation!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)})")
        if reader.optional("use_bidirectional_attention", False):
            raise reader.error("use_bidirectional_attention",
                               "bidirectional attention is not supported (causal models only)")
        position_type = reader.optional("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise reader.error("position_embedding_type", f"{position_type!r} is not "
                                                          "supported (only 'absolute')")
        rope, local_rope = read_ropes(reader)
        intermediate_size = reader.positive_int("intermediate_size")
        moe = read_moe(reader, num_layers, intermediate_size)
        mla = read_mla(reader)
        config = cls(
            vocab_size=reader.positive_int("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=reader.optional("num_key_value_heads", None) or num_heads,
            head_dim=(mla.qk_rope_head_dim if mla is not None else
                      reader.optional("head_dim", None) or hidden_size // num_heads),
            rms_norm_eps=float(reader.optional("rms_norm_eps", 1e-6)),
            rope=rope,
            tie_word_embeddings=bool(reader.optional("tie_word_embeddings", False)),
            attention_bias=bool(reader.optional("attention_bias", False)),
            mlp_bias=bool(reader.optional("mlp_bias", False)),
            sliding_windows=_sliding_windows(reader, num_layers),
            num_experts=0 if moe is None else moe.num_experts,
            num_experts_per_tok=0 if moe is None else moe.top_k,
            moe=moe,
            hidden_act=activation,
            qkv_bias=bool(reader.optional("qkv_bias", False)),
            mla=mla,
            mamba=read_mamba(reader, num_layers, hidden_size),
            local_rope=local_rope,
            query_pre_attn_scalar=reader.optional_float("query_pre_attn_scalar"),
            attn_logit_softcapping=reader.optional_float("attn_logit_softcapping"),
            final_logit_softcapping=reader.optional_float("final_logit_softcapping"),
            layer_norm_eps=float(reader.optional("layer_norm_eps", 1e-12)),
            max_position_embeddings=int(reader.optional("max_position_embeddings", 0)),
            type_vocab_size=int(reader.optional("type_vocab_size", 0)),
        )
        _check_attention_shape(reader, config, rotary=model_type not in ABSOLUTE_POSITIONS)
        return config


def _check_attention_shape(reader: ConfigReader, config: ArchConfig, rotary: bool) -> None:
    """The checks between fields: whole query heads per key/value head, a head of at least
    one dimension, and (``rotary``: the model uses RoPE) a rotated share of whole pairs."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise reader.error("num_key_value_heads", f"{kv_heads} does not divide the "
                                                  f"{heads} attention heads")
    if config.head_dim < 1:  # hidden_size // num_attention_heads where head_dim is unset
        raise reader.error("head_dim", f"is {config.head_dim} (hidden_size "
                                       f"{config.hidden_size} / {heads} heads)")
    rotated = int(config.head_dim * config.rope.partial_rotary_factor)
    if rotary and config.mla is None and (rotated < 2 or rotated % 2):
        raise reader.error("partial_rotary_factor", f"rotates {rotated} of the "
                                                    f"{config.head_dim} dimensions of a head; "
                                                    "RoPE needs a positive, even number")


def _sliding_windows(reader: ConfigReader, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's window (None: full attention); a layer that uses one must see at
    least itself."""
    windows = _layer_windows(reader, num_layers)
    if any(window is not None and window < 1 for window in windows):
        raise reader.error("sliding_window", f"{reader.raw['sliding_window']} tokens: the "
                                             "layers that use it need a window of at least 1")
    return windows


def _layer_windows(reader: ConfigReader, num_layers: int) -> tuple[int | None, ...]:
    """Which layers use a sliding window, in the four ways HF configs say it.

    ``layer_types`` lists each layer; older Gemma 3 files give a ``sliding_window_pattern``
    instead; Qwen2/3 use ``use_sliding_window`` and window only the layers from
    ``max_window_layers`` on; Mistral/Mixtral window every layer when ``sliding_window`` is set.
    """
    window = reader.optional("sliding_window", None)
    if window is None:
        return (None,) * num_layers
    layer_types = reader.optional("layer_types", None)
    if layer_types is not None:
        if len(layer_types) != num_layers:
            raise reader.error("layer_types", f"has {len(layer_types)} entries for "
                                              f"{num_layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    pattern = reader.optional("sliding_window_pattern", None)
    if pattern is not None:  # Gemma 3's older files: every pattern-th layer is global
        return tuple(None if (layer + 1) % pattern == 0 else window for layer in range(num_layers))
    if "use_sliding_window" in reader.raw:
        if not reader.raw["use_sliding_window"]:
            return (None,) * num_layers
        first = reader.optional("max_window_layers", 0)
        return tuple(window if layer >= first else None for layer in range(num_layers))
    return (window,) * num_layers


def eos_token_ids(hf_config: dict[str, Any],
                  generation_config: GenerationConfig | None = None) -> list[int]:
    """Every EOS id of the model, each once: config.json's (one id or a list in HF configs)
    first, then generation_config.json's. Instruct models often list several (Llama 3:
    <|end_of_text|>, <|eom_id|>, <|eot_id|>), and each must end a request."""
    eos = hf_config.get("eos_token_id")
    ids = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    extra = generation_config.eos_token_ids if generation_config is not None else []
    return list(dict.fromkeys([*ids, *extra]))


def model_eos_token_ids(files: ModelFiles, generation_config: str = "auto") -> list[int]:
    """``eos_token_ids`` of a loaded model's files, with the generation config that
    ``--generation-config`` (``generation_config``) selects: what ends its requests."""
    return eos_token_ids(files.hf_config, read_generation_config(files, generation_config))
