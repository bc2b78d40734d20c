"""GGUF test material: random quantized tensors and tiny GGUF files written with gguf's writer.

Quantized tensors are random bytes (every bit pattern of the quants is valid) with their fp16
scales replaced by finite values, so no NaN/inf hides a mismatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter, Keys, RopeScalingType, TokenType
from gguf import GGMLQuantizationType as GgmlType
from tokenizers import pre_tokenizers

from octavo.models.loader import ModelFiles
from octavo.models.loader.quantized import GgufTensor

# Byte offsets of the fp16 scales inside one block of each quantized type.
SCALE_OFFSETS = {
    GgmlType.Q4_0: (0,),
    GgmlType.Q4_1: (0, 2),
    GgmlType.Q5_0: (0,),
    GgmlType.Q5_1: (0, 2),
    GgmlType.Q8_0: (0,),
    GgmlType.Q4_K: (0, 2),
    GgmlType.Q5_K: (0, 2),
    GgmlType.Q6_K: (208,),
}

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>{% endfor %}"
)



def dense_weights(files: ModelFiles) -> dict[str, torch.Tensor]:
    """Every weight of ``files``, the quantized ones (``GgufTensor``) dequantized to fp32:
    what the dense option (``--quantization none``) loads."""
    return {name: tensor.dequantize() if isinstance(tensor, GgufTensor) else tensor
            for name, tensor in files.iter_weights()}


def random_raw(ggml_type: GgmlType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random stored data of a tensor of torch ``shape``, as gguf's reader presents it:
    float32/float16 arrays for F32/F16, else uint8 of shape (rows..., bytes per row)."""
    values = rng.standard_normal(shape).astype(np.float32)
    if ggml_type == GgmlType.F32:
        return values
    if ggml_type == GgmlType.F16:
        return values.astype(np.float16)
    if ggml_type == GgmlType.BF16:
        bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
        return bf16.view(np.uint8).reshape(*shape[:-1], shape[-1] * 2)
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    n_blocks = math.prod(shape) // block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[ggml_type]:
        scales = (0.1 * rng.standard_normal((n_blocks, 1))).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // block_elems * block_bytes)


@dataclass
class TinyGguf:
    """A tiny random model in GGUF form: llama.cpp tensor names, random stored data."""

    arch: str = "llama"
    hidden: int = 256  # k-quants need rows that are multiples of 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    qkv_bias: bool = False
    qk_norm: bool = False
    tied: bool = False
    rope_scaling: RopeScalingType | None = None
    types: dict[str, GgmlType] = field(default_factory=dict)  # tensor name -> type; else F32
    extra_tensors: tuple[str, ...] = ()  # names written as F32 vectors, beyond the model's own
    split_count: int = 1  # > 1 marks the file as the first part of a split GGUF

    def tensor_shapes(self, vocab: int) -> dict[str, tuple[int, ...]]:
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,)}
        if not self.tied:
            shapes["output.weight"] = (vocab, h)
        for i in range(self.layers):
            layer = {
                "attn_norm.weight": (h,),
                "ffn_norm.weight": (h,),
                "attn_q.weight": (q, h),
                "attn_k.weight": (kv, h),
                "attn_v.weight": (kv, h),
                "attn_output.weight": (h, q),
                "ffn_gate.weight": (self.intermediate, h),
                "ffn_up.weight": (self.intermediate, h),
                "ffn_down.weight": (h, self.intermediate),
            }
            if self.qkv_bias:
                layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
            if self.qk_norm:
                layer.update({"attn_q_norm.weight": (self.head_dim,),
                              "attn_k_norm.weight": (self.head_dim,)})
            shapes.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
        shapes.update({name: (self.hidden,) for name in self.extra_tensors})
        return shapes

    def write(self, path: Path, rng: np.random.Generator) -> None:
        tokens, token_types, merges = _tiny_vocabulary()
        writer = GGUFWriter(path, self.arch)
        writer.add_name("tiny")
        writer.add_vocab_size(len(tokens))
        writer.add_context_length(256)
        writer.add_embedding_length(self.hidden)
        writer.add_feed_forward_length(self.intermediate)
        writer.add_block_count(self.layers)
        writer.add_head_count(self.heads)
        writer.add_head_count_kv(self.kv_heads)
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        writer.add_rope_dimension_count(self.head_dim)
        writer.add_rope_freq_base(float(rng.uniform(1e4, 1e6)))
        writer.add_layer_norm_rms_eps(1e-5)
        if self.rope_scaling is not None:
            writer.add_rope_scaling_type(self.rope_scaling)
            writer.add_rope_scaling_factor(2.0)
        if self.split_count > 1:
            writer.add_uint16(Keys.Split.LLM_KV_SPLIT_COUNT, self.split_count)
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_types(token_types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(tokens.index("<|bos|>"))
        writer.add_eos_token_id(tokens.index("<|eos|>"))
        writer.add_chat_template(TINY_CHAT_TEMPLATE)
        for name, shape in self.tensor_shapes(len(tokens)).items():
            ggml_type = self.types.get(name, GgmlType.F32)
            writer.add_tensor(name, random_raw(ggml_type, shape, rng), raw_dtype=ggml_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def _tiny_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, two merges, two control tokens."""
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "<|bos|>", "<|eos|>"]
    types = [TokenType.NORMAL] * (len(tokens) - 2) + [TokenType.CONTROL] * 2
    return tokens, types, ["Ġ t", "h e"]
