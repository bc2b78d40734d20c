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


ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2", permuted_qk=False),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", permuted_qk=False),
    # Four norms per layer: ffn_norm is the pre-feedforward one (Llama's post-attention).
    "gemma3": GgufArchitecture("Gemma3ForCausalLM", "gemma3_text", permuted_qk=False,
                               hidden_act="gelu_pytorch_tanh", norm_shift=1.0,
                               rope_scalings=("none", "linear"), layer_tensors={
                                   "ffn_norm": "pre_feedforward_layernorm",
                                   "post_attention_norm": "post_attention_layernorm",
                                   "post_ffw_norm": "post_feedforward_layernorm",
                               }),
}

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
