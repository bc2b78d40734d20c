"""An HF-style config.json dict synthesized from a GGUF's ``<arch>.*`` metadata.

Models are built from HF configs only, so a GGUF must look like one: this maps llama.cpp's
metadata keys onto the HF field names (and fills what GGUF leaves implicit).
"""

from __future__ import annotations

from typing import Any

from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.gguf_metadata import GgufFile
from octavo.models.loader.gguf_names import GgufArchitecture

DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's value when rope.freq_base is absent


def synthesize_hf_config(gguf: GgufFile, arch: GgufArchitecture) -> dict[str, Any]:
    prefix = gguf.architecture

    def key(name: str) -> str:
        return f"{prefix}.{name}"

    scaling = gguf.get(key("rope.scaling.type"), "none")
    if scaling != "none":
        raise ModelLoadError(f"{gguf.path}: RoPE scaling type {scaling!r} is not supported")
    hidden_size = gguf.require(key("embedding_length"))
    num_heads = gguf.require(key("attention.head_count"))
    embedding = gguf.tensors.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{gguf.path}: GGUF has no token_embd.weight tensor")
    return {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": hidden_size,
        "num_hidden_layers": gguf.require(key("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": gguf.get(key("attention.head_count_kv"), num_heads),
        "head_dim": gguf.get(key("attention.key_length"), hidden_size // num_heads),
        "intermediate_size": gguf.require(key("feed_forward_length")),
        # The embedding's row count, not tokenizer metadata: it is what the weights hold.
        "vocab_size": int(embedding.shape[1]),
        "rms_norm_eps": gguf.require(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": gguf.get(key("rope.freq_base"), DEFAULT_ROPE_THETA),
        "rope_scaling": None,
        "max_position_embeddings": gguf.require(key("context_length")),
        # llama.cpp writes output.weight only when it differs from the embedding.
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id"),
        # Quantized tensors are dequantized to fp32.
        "torch_dtype": "float32",
    }
