"""The Llama family (Llama, SmolLM, Mistral, Qwen2, Qwen3) as pure JAX functions.

Weights come from the core's loaders: the core builds its torch model from the HF folder
or GGUF file (so every dialect, dequantisation and q/k permutation the core handles is
handled here too), and :func:`params_from_torch` converts its state dict to jax arrays
once. q/k/v and gate/up stay separate arrays here (the core fuses them) so that each can
be split by heads over a tensor-parallel mesh.

:func:`forward` is one engine step, functional: ``(params, kv_caches, inputs, metadata)
-> (kv_caches, logits)``; the runner jits it with the caches donated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]  # a pytree of jax arrays
AttentionFn = Callable[..., jax.Array]


@dataclass(frozen=True)
class ModelSpec:
    """The static shape of the model: what jit specialises on besides the array shapes."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    rms_norm_eps: float
    sliding_windows: tuple[int | None, ...]
    qk_norm: bool

    @property
    def sm_scale(self) -> float:
        return self.head_dim**-0.5


def spec_from_torch(model: Any) -> ModelSpec:
    """The spec of a core ``LlamaForCausalLM`` (built with one rank: all heads)."""
    config = model.config
    return ModelSpec(
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.rms_norm_eps,
        sliding_windows=tuple(config.sliding_windows),
        qk_norm=bool(type(model).qk_norm),
    )


def params_from_torch(model: Any, spec: ModelSpec, dtype: jnp.dtype) -> Params:
    """Numpy copies of the torch model's weights, linear ones transposed to ``[in, out]``
    and fused ones split; they become device arrays when the runner places them."""
    state = {name: tensor.detach().float().numpy() for name, tensor in
             model.state_dict().items()}
    q_size = spec.num_heads * spec.head_dim
    kv_size = spec.num_kv_heads * spec.head_dim

    def cast(array: np.ndarray) -> jax.Array:
        return jnp.asarray(array, dtype=dtype)

    def split_linear(prefix: str, sizes: list[int], names: list[str]) -> Params:
        out: Params = {}
        for kind in ("weight", "bias"):
            full = state.get(f"{prefix}.{kind}")
            if full is None:
                continue
            parts = np.split(full, np.cumsum(sizes)[:-1], axis=0)
            for name, part in zip(names, parts, strict=True):
                out[f"{name}_{kind[0]}"] = cast(part.T if kind == "weight" else part)
        return out

    layers = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        intermediate = state[f"{p}.mlp.down_proj.weight"].shape[1]
        layer = {
            **split_linear(f"{p}.self_attn.qkv_proj", [q_size, kv_size, kv_size],
                           ["q", "k", "v"]),
            **split_linear(f"{p}.self_attn.o_proj", [spec.hidden_size], ["o"]),
            **split_linear(f"{p}.mlp.gate_up_proj", [intermediate] * 2, ["gate", "up"]),
            **split_linear(f"{p}.mlp.down_proj", [spec.hidden_size], ["down"]),
            "input_norm": cast(state[f"{p}.input_layernorm.weight"]),
            "post_norm": cast(state[f"{p}.post_attention_layernorm.weight"]),
        }
        if spec.qk_norm:
            layer["q_norm"] = cast(state[f"{p}.self_attn.q_norm.weight"])
            layer["k_norm"] = cast(state[f"{p}.self_attn.k_norm.weight"])
        layers.append(layer)
    return {
        "embed": cast(state["model.embed_tokens.weight"]),
        "lm_head": cast(state["lm_head.weight"]),
        "norm": cast(state["model.norm.weight"]),
        "inv_freq": jnp.asarray(model.rotary_emb.inv_freq.numpy(), dtype=jnp.float32),
        "layers": layers,
    }


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``weight * x / rms(x)``, the statistics in fp32 as HF (and the core) compute them."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """HF's rotate-half rotary embedding of ``x [T, heads, D]``."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _linear(x: jax.Array, layer: Params, name: str) -> jax.Array:
    y = x @ layer[f"{name}_w"]
    bias = layer.get(f"{name}_b")
    return y if bias is None else y + bias


def _attention_block(spec: ModelSpec, layer: Params, index: int, hidden: jax.Array,
                     cos: jax.Array, sin: jax.Array, kv_cache: jax.Array,
                     inputs: dict[str, jax.Array], metadata: dict[str, jax.Array],
                     attention: AttentionFn, write_kv: AttentionFn,
                     ) -> tuple[jax.Array, jax.Array]:
    num_tokens = hidden.shape[0]
    q = _linear(hidden, layer, "q").reshape(num_tokens, spec.num_heads, spec.head_dim)
    k = _linear(hidden, layer, "k").reshape(num_tokens, spec.num_kv_heads, spec.head_dim)
    v = _linear(hidden, layer, "v").reshape(num_tokens, spec.num_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q = rms_norm(q, layer["q_norm"], spec.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], spec.rms_norm_eps)
    q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    kv_cache = write_kv(kv_cache, k, v, inputs["slot_mapping"], inputs["num_tokens"])
    out = attention(q, kv_cache, metadata["kv_lens"], metadata["page_indices"],
                    metadata["cu_q_lens"], metadata["num_seqs"], sm_scale=spec.sm_scale,
                    sliding_window=spec.sliding_windows[index])
    return _linear(out.reshape(num_tokens, -1), layer, "o"), kv_cache


def forward(spec: ModelSpec, attention: AttentionFn, write_kv: AttentionFn, params: Params,
            kv_caches: list[jax.Array], inputs: dict[str, jax.Array],
            metadata: dict[str, jax.Array]) -> tuple[list[jax.Array], jax.Array]:
    """One step over the flattened tokens: the new caches and the fp32 logits of the
    tokens at ``inputs["logits_indices"]`` (one per request slot, padding included)."""
    hidden = params["embed"][inputs["input_ids"]]
    freqs = inputs["positions"].astype(jnp.float32)[:, None] * params["inv_freq"]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]
    cos, sin = jnp.cos(angles).astype(hidden.dtype), jnp.sin(angles).astype(hidden.dtype)
    new_caches = []
    for index, (layer, kv_cache) in enumerate(zip(params["layers"], kv_caches, strict=True)):
        residual = hidden
        attn_out, kv_cache = _attention_block(
            spec, layer, index, rms_norm(hidden, layer["input_norm"], spec.rms_norm_eps),
            cos, sin, kv_cache, inputs, metadata, attention, write_kv)
        new_caches.append(kv_cache)
        hidden = residual + attn_out
        residual = hidden
        normed = rms_norm(hidden, layer["post_norm"], spec.rms_norm_eps)
        mlp = jax.nn.silu(_linear(normed, layer, "gate")) * _linear(normed, layer, "up")
        hidden = residual + _linear(mlp, layer, "down")
    last = rms_norm(hidden[inputs["logits_indices"]], params["norm"], spec.rms_norm_eps)
    logits = (last @ params["lm_head"].T).astype(jnp.float32)
    return new_caches, logits
