"""The GGUF architectures Octavo reads and llama.cpp's tensor names for their HF parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GgufArchitecture:
    """What a GGUF ``general.architecture`` becomes on the Hugging Face side."""

    hf_architecture: str
    model_type: str
    # llama.cpp's llama converter interleaves the rows of each Q/K head (for its RoPE kernel);
    # its qwen converters do not.
    permuted_qk: bool
    hidden_act: str = "silu"
    # The rope.scaling.type values read (Gemma 3's converter writes linear scaling, of the
    # global layers only); any other is refused.
    rope_scalings: tuple[str, ...] = ("none",)
    # llama.cpp stores Gemma's RMSNorm weights as 1 + w (its norm multiplies by the weight),
    # HF as w: this much is subtracted from every ``*norm.weight`` on loading.
    norm_shift: float = 0.0
    # Layer tensors this architecture names differently from ``_LAYER_TENSORS``.
    layer_tensors: dict[str, str] = field(default_factory=dict)
    # Tensors the config is read from, not weights (Phi-3's LongRoPE factors).
    config_tensors: tuple[str, ...] = ()


# Gemma 2 and 3's four norms per layer: ffn_norm is the pre-feedforward one (Llama's
# post-attention one).
_GEMMA_NORMS = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# A mixture of experts' router and shared expert (Qwen2-MoE's, with its gate).
_MOE_TENSORS = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}

ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2", permuted_qk=False),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", permuted_qk=False),
    "gemma3": GgufArchitecture("Gemma3ForCausalLM", "gemma3_text", permuted_qk=False,
                               hidden_act="gelu_pytorch_tanh", norm_shift=1.0,
                               rope_scalings=("none", "linear"), layer_tensors=_GEMMA_NORMS),
    "gemma2": GgufArchitecture("Gemma2ForCausalLM", "gemma2", permuted_qk=False,
                               hidden_act="gelu_pytorch_tanh", norm_shift=1.0,
                               layer_tensors=_GEMMA_NORMS),
    # q/k/v and gate/up stay fused, as in Phi-3's own checkpoints.
    "phi3": GgufArchitecture("Phi3ForCausalLM", "phi3", permuted_qk=False, layer_tensors={
        "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
        config_tensors=("rope_factors_long.weight", "rope_factors_short.weight")),
    "qwen2moe": GgufArchitecture("Qwen2MoeForCausalLM", "qwen2_moe", permuted_qk=False,
                                 layer_tensors=_MOE_TENSORS),
    "qwen3moe": GgufArchitecture("Qwen3MoeForCausalLM", "qwen3_moe", permuted_qk=False,
                                 layer_tensors=_MOE_TENSORS),
}

# Tensors of every expert stacked ([experts, out, in]): HF names each expert's own, the
# ``{expert}`` in the name (``GgufWeights`` yields them one by one).
EXPERT = "{expert}"

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_exps": f"mlp.experts.{EXPERT}.gate_proj",
    "ffn_up_exps": f"mlp.experts.{EXPERT}.up_proj",
    "ffn_down_exps": f"mlp.experts.{EXPERT}.down_proj",
}


def hf_tensor_name(gguf_name: str, arch: GgufArchitecture | None = None) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (in ``arch``'s
    naming; the Llama family's without one); None if unknown."""
    module, _, kind = gguf_name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if module in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[module]}.{kind}"
    layer_tensors = _LAYER_TENSORS if arch is None else {**_LAYER_TENSORS, **arch.layer_tensors}
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_tensors:
        return f"model.layers.{parts[1]}.{layer_tensors[parts[2]]}.{kind}"
    return None
