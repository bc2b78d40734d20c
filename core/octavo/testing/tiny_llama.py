"""``write_tiny_llama(folder, seed)``: a tiny Llama with random weights as a Hugging Face
folder (config.json, model.safetensors, a byte-level tokenizer), for running an engine in a
plugin's tests in well under a second.

Written with the standard library, numpy and torch alone - the safetensors file by hand, from
its published layout - so the kit needs no model download and no transformers. Every weight
is random, norms included (ones would hide a norm loaded into the wrong place).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")  # ids 256, 257, 258, after the bytes
VOCAB_SIZE = 320  # larger than the tokenizer, as real models pad their vocabulary
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 16
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def write_tiny_llama(folder: Path, seed: int) -> Path:
    """Write the model to ``folder`` (created if needed); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
    _write_safetensors(folder / "model.safetensors", _weights(np.random.default_rng(seed)))
    (folder / "tokenizer.json").write_text(json.dumps(_tokenizer()))
    bos, eos, pad = SPECIAL_TOKENS
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "pad_token": pad, "model_max_length": CONFIG["max_position_embeddings"]}))
    return folder


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """HF Llama parameter names and shapes, weights ~ N(0, 0.1), norms ~ 1 + N(0, 0.2)."""
    hidden, inter = HIDDEN, INTERMEDIATE
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (VOCAB_SIZE, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (VOCAB_SIZE, hidden)}
    for i in range(LAYERS):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (q_size, hidden),
            layer + "self_attn.k_proj.weight": (kv_size, hidden),
            layer + "self_attn.v_proj.weight": (kv_size, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q_size),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
        }
    return {name: (1.0 + 0.2 * rng.standard_normal(shape) if name.endswith("norm.weight")
                   else 0.1 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in shapes.items()}


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: an 8-byte little-endian header size, a JSON header naming each
    tensor's dtype, shape and byte range (padded to 8 bytes), then the raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for array in tensors.values():
            file.write(array.astype("<f4").tobytes())


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _tokenizer() -> dict[str, object]:
    """A byte-level BPE with no merges (one token per byte) and the special tokens."""
    vocab = {char: i for i, char in enumerate(sorted(_byte_alphabet()))}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256 + i, "content": token, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True} for i, token in enumerate(SPECIAL_TOKENS)],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
