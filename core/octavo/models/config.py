"""``ArchConfig``: a typed view of an HF ``config.json`` dict for the models of this package.

HF configs come in several dialects (transformers 5 writes ``rope_parameters``, per layer type
for Gemma 3, older files ``rope_theta`` + ``rope_scaling``; Qwen marks sliding-window layers
differently from Mistral, Gemma 3 with ``layer_types`` or ``sliding_window_pattern``).
Reading them once here, with errors that name the field, keeps the models free of dict lookups.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.models.generation_config import GenerationConfig, read_generation_config
from octavo.models.loader import ModelFiles, ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")
# Older names HF configs still carry: Phi-3's first long-context files said "su".
ROPE_TYPE_ALIASES = {"su": "longrope"}
# RoPE scalings whose frequencies depend on the length of the sequence (HF recomputes them
# from the longest position of each forward pass): see ``RopeConfig.length_dependent``.
LENGTH_DEPENDENT_ROPE_TYPES = ("longrope", "dynamic")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
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


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts' shape and routing, in every family's dialect (Mixtral's
    ``num_local_experts``; Qwen's ``num_experts``, shared expert and sparse steps;
    DeepSeek's ``n_routed_experts``, shared experts, dense first layers and groups)."""

    num_experts: int
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # of each routed expert (moe_intermediate_size)
    layers: tuple[bool, ...]  # per decoder layer: whether its MLP is the mixture
    renormalize: bool = True  # the top-k weights divided by their sum (norm_topk_prob)
    # Experts every token runs (Qwen: one of shared_expert_intermediate_size; DeepSeek:
    # n_shared_experts of moe_intermediate_size, as one MLP); 0: none.
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(gate(x)) scales the shared one
    # DeepSeek's group-limited top-k: experts in num_groups groups, the top_k chosen among
    # the topk_groups groups with the best expert; and a factor on the routing weights.
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values come from one latent
    per token, ``kv_lora_rank`` wide, through ``kv_b_proj``; a ``qk_rope_head_dim`` key part
    carries the position, shared by every head. Queries are projected directly
    (``q_lora_rank`` None, V2-Lite) or through a low-rank ``q_a_proj``/``q_b_proj`` pair."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
        reader = _Reader({**defaults, **hf_config}, str(source))
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
        rope, local_rope = _ropes(reader)
        intermediate_size = reader.positive_int("intermediate_size")
        moe = _moe(reader, num_layers, intermediate_size)
        mla = _mla(reader)
        return cls(
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
            local_rope=local_rope,
            query_pre_attn_scalar=reader.optional_float("query_pre_attn_scalar"),
            attn_logit_softcapping=reader.optional_float("attn_logit_softcapping"),
            final_logit_softcapping=reader.optional_float("final_logit_softcapping"),
            layer_norm_eps=float(reader.optional("layer_norm_eps", 1e-12)),
            max_position_embeddings=int(reader.optional("max_position_embeddings", 0)),
            type_vocab_size=int(reader.optional("type_vocab_size", 0)),
        )


class _Reader:
    """Field access on the raw dict with errors that say which file and field are wrong."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def error(self, key: str, problem: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: config field {key!r}: {problem}")

    def positive_int(self, key: str) -> int:
        if key not in self.raw:
            raise self.error(key, "is missing")
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(key, f"must be a positive integer, got {value!r}")
        return value

    def optional(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        return default if value is None else value

    def optional_float(self, key: str) -> float | None:
        """A positive number, or None where the config leaves it out or sets it null."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.error(key, f"must be a positive number or null, got {value!r}")
        return float(value)


def _ropes(reader: _Reader) -> tuple[RopeConfig, RopeConfig | None]:
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


def _rope(reader: _Reader, key: str, params: dict[str, Any]) -> RopeConfig:
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


def _longrope_factors(reader: _Reader, key: str, params: dict[str, Any],
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


def _mla(reader: _Reader) -> MLAConfig | None:
    """The latent attention of a DeepSeek config (it has ``kv_lora_rank``), else None."""
    if reader.optional("kv_lora_rank", None) is None:
        return None
    q_lora_rank = reader.optional("q_lora_rank", None)
    return MLAConfig(kv_lora_rank=reader.positive_int("kv_lora_rank"),
                     qk_nope_head_dim=reader.positive_int("qk_nope_head_dim"),
                     qk_rope_head_dim=reader.positive_int("qk_rope_head_dim"),
                     v_head_dim=reader.positive_int("v_head_dim"),
                     q_lora_rank=None if q_lora_rank is None else
                     reader.positive_int("q_lora_rank"))


def _moe(reader: _Reader, num_layers: int, intermediate_size: int) -> MoEConfig | None:
    """The mixture of experts a config describes, None for a dense model. Which layers are
    sparse, as each family's HF modelling decides: DeepSeek's from first_k_dense_replace on;
    Qwen's every decoder_sparse_step-th but mlp_only_layers; Jamba's every
    expert_layer_period-th from expert_layer_offset; Mixtral's all."""
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts")
                if reader.optional(k, 0)), None)
    if key is None:
        return None
    num_experts = int(reader.raw[key])
    top_k = int(reader.optional("num_experts_per_tok", 0))
    if not 1 <= top_k <= num_experts:
        raise reader.error("num_experts_per_tok", f"must be in 1..{num_experts} ({key}), "
                                                  f"got {top_k}")
    layers = range(num_layers)
    moe_size = int(reader.optional("moe_intermediate_size", 0)) or intermediate_size
    if key == "n_routed_experts":  # DeepSeek
        first_sparse = int(reader.optional("first_k_dense_replace", 0))
        groups = (int(reader.optional("n_group", 1)), int(reader.optional("topk_group", 1)))
        if reader.optional("topk_method", "greedy") == "greedy":
            groups = (1, 1)
        if num_experts % groups[0] or not 1 <= groups[1] <= groups[0]:
            raise reader.error("n_group", f"{num_experts} experts in {groups[0]} groups, "
                                          f"top {groups[1]} of them: not a valid split")
        # HF's DeepSeek-V2 router never renormalises (whatever norm_topk_prob says).
        return MoEConfig(num_experts, top_k, moe_size, tuple(i >= first_sparse for i in layers),
                         renormalize=False, num_groups=groups[0], topk_groups=groups[1],
                         shared_intermediate_size=moe_size * int(
                             reader.optional("n_shared_experts", 0)),
                         routed_scaling_factor=float(
                             reader.optional("routed_scaling_factor", 1.0)))
    if "expert_layer_period" in reader.raw:  # Jamba
        period = int(reader.raw["expert_layer_period"])
        offset = int(reader.optional("expert_layer_offset", 0))
        return MoEConfig(num_experts, top_k, moe_size,
                         tuple(i % period == offset for i in layers), renormalize=False)
    dense = set(reader.optional("mlp_only_layers", []))
    step = int(reader.optional("decoder_sparse_step", 1))
    shared = int(reader.optional("shared_expert_intermediate_size", 0))
    return MoEConfig(num_experts, top_k, moe_size,
                     tuple(i not in dense and (i + 1) % step == 0 for i in layers),
                     renormalize=bool(reader.optional("norm_topk_prob", True)),
                     shared_intermediate_size=shared, shared_expert_gate=shared > 0)


def _sliding_windows(reader: _Reader, num_layers: int) -> tuple[int | None, ...]:
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
