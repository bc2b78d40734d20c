"""Tiny random HF models (Llama, Qwen2, Qwen3, Mistral, Mixtral, Gemma 3) for tests, built
locally.

``save_tiny_model(arch, folder, seed)`` writes an HF folder (config.json, model.safetensors,
tokenizer.json with a chat template) and returns the HF transformers model with the same
weights, in eval mode with eager attention, to serve as the reference. Each architecture
exercises one family trait: llama3 RoPE scaling (llama), q/k/v biases (qwen2), per-head q/k
norms, head_dim != hidden/heads and tied embeddings (qwen3), a sliding window and linear
RoPE scaling (mistral), a mixture of experts (mixtral). Gemma 3 (``gemma3``, not in
``TINY_ARCHS``: its own tests in test_gemma3.py) interleaves local and global layers, each
kind with its RoPE, the global one scaled.

All weights are random, norms and biases included (HF initialises those to ones/zeros,
which would hide a norm or bias loaded into the wrong place).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from octavo.testing.seeds import draw_seed

TINY_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "mixtral")

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258  # after the 256 byte tokens
VOCAB_SIZE = 320  # larger than the tokenizer, as real models pad their vocabulary
MISTRAL_SLIDING_WINDOW = 8
GEMMA3_SLIDING_WINDOW = 8
GEMMA3_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    tie_word_embeddings=False,
)


def tiny_config(arch: str, **overrides: object) -> PretrainedConfig:
    """The HF config of the tiny ``arch`` (one of ``TINY_ARCHS``), with ``overrides`` of its
    fields (more heads, experts, layers for the parallelism tests)."""
    config = _base_config(arch)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _base_config(arch: str) -> PretrainedConfig:
    if arch == "llama":
        return LlamaConfig(**_COMMON, rope_theta=10000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    if arch == "qwen2":
        return Qwen2Config(**{**_COMMON, "num_key_value_heads": 1})
    if arch == "qwen3":
        return Qwen3Config(**{**_COMMON, "head_dim": 32, "tie_word_embeddings": True})
    if arch == "mistral":
        return MistralConfig(**_COMMON, sliding_window=MISTRAL_SLIDING_WINDOW,
                             rope_scaling={"rope_type": "linear", "factor": 2.0})
    if arch == "mixtral":
        return MixtralConfig(**{**_COMMON, "intermediate_size": 96}, num_local_experts=4,
                             num_experts_per_tok=2)
    if arch == "gemma3":
        # head_dim != hidden/heads and query_pre_attn_scalar != head_dim, so neither can
        # stand in for the other; logits soft-capped, though released Gemma 3s do not.
        return Gemma3TextConfig(
            **{**_COMMON, "num_hidden_layers": len(GEMMA3_LAYER_TYPES),
               "tie_word_embeddings": True},
            head_dim=32, query_pre_attn_scalar=24, sliding_window=GEMMA3_SLIDING_WINDOW,
            layer_types=GEMMA3_LAYER_TYPES, final_logit_softcapping=30.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})
    raise ValueError(f"unknown tiny architecture {arch!r}; choose from {TINY_ARCHS} or "
                     "gemma3")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (one token per byte, no merges) with bos/eos/pad specials."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)},
                                     merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    bos, eos, pad = SPECIAL_TOKENS
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=eos,
                                   pad_token=pad)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(arch: str, seed: int, **overrides: object) -> PreTrainedModel:
    """The tiny HF model with random weights drawn from ``seed`` (eval mode, eager attention)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides),
                                             attn_implementation="eager")
    randomize_norms_and_biases(model)
    return model.eval()


@torch.no_grad()
def randomize_norms_and_biases(model: torch.nn.Module) -> None:
    """Random norm weights around 1 and biases around 0, from torch's global generator."""
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.2 * torch.randn_like(param))
        elif name.endswith("bias"):
            param.copy_(0.1 * torch.randn_like(param))


def save_tiny_model(arch: str, folder: Path, seed: int, **overrides: object) -> PreTrainedModel:
    """Write the tiny ``arch`` model and tokenizer to ``folder``; return the HF model."""
    model = make_tiny_model(arch, seed, **overrides)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


@dataclass
class TinyModel:
    folder: Path
    seed: int  # of its random weights; in assert messages, to reproduce a failure


def fresh_tiny_llama(folder: Path) -> TinyModel:
    """A tiny Llama with freshly drawn random weights, saved to ``folder`` (served or loaded
    by engines in other processes, hence a folder rather than a model object)."""
    seed = draw_seed()
    save_tiny_model("llama", folder, seed=seed)
    return TinyModel(folder, seed)
