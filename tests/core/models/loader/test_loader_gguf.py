"""GGUF loading on tiny GGUF files written here: weights and config against HF transformers'
own GGUF loader on the same file, every quantized type, the Q/K unpermute, and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GgmlType
from gguf import RopeScalingType
from transformers import AutoModelForCausalLM

from octavo.models.loader import ModelLoadError, load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.loader_helpers import TINY_CHAT_TEMPLATE, TinyGguf, dense_weights

# Every supported type on some matrix, Q and K among them, so the unpermute sees each layout.
ALL_TYPES = {
    "token_embd.weight": GgmlType.Q6_K,
    "output.weight": GgmlType.Q4_K,
    "blk.0.attn_q.weight": GgmlType.Q4_K,
    "blk.0.attn_k.weight": GgmlType.Q6_K,
    "blk.0.attn_v.weight": GgmlType.Q8_0,
    "blk.0.attn_output.weight": GgmlType.Q4_0,
    "blk.0.ffn_gate.weight": GgmlType.Q4_1,
    "blk.0.ffn_up.weight": GgmlType.F16,
    "blk.0.ffn_down.weight": GgmlType.BF16,
    "blk.1.attn_q.weight": GgmlType.Q4_0,
    "blk.1.attn_k.weight": GgmlType.Q4_1,
    "blk.1.attn_v.weight": GgmlType.F16,
    "blk.1.attn_output.weight": GgmlType.BF16,
    "blk.1.ffn_gate.weight": GgmlType.Q8_0,
}

MODELS = {
    "llama-untied-all-types": TinyGguf(types=ALL_TYPES),
    "llama-gqa8-tied": TinyGguf(heads=8, kv_heads=1, head_dim=32, tied=True),
    "qwen2-bias-tied": TinyGguf(arch="qwen2", qkv_bias=True, tied=True,
                                types={"blk.0.attn_q.weight": GgmlType.Q8_0}),
    # head_dim 128 != hidden/heads = 64: only GGUF's key_length says so.
    "qwen3-qknorm": TinyGguf(arch="qwen3", qk_norm=True, head_dim=128,
                             types={"blk.1.attn_k.weight": GgmlType.Q4_K}),
}


def write(tmp_path: Path, spec: TinyGguf, name: str = "tiny.gguf") -> tuple[Path, int]:
    seed = draw_seed()
    path = tmp_path / name
    spec.write(path, np.random.default_rng(seed))
    return path, seed


@pytest.mark.parametrize("model", MODELS, ids=str)
def test_weights_and_config_match_transformers_gguf_loader(tmp_path: Path, model: str) -> None:
    spec = MODELS[model]
    path, seed = write(tmp_path, spec)
    files = load_model_files(path)
    ours = dense_weights(files)
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    )
    expected = reference.state_dict()
    if spec.tied:
        assert "lm_head.weight" not in ours, f"seed={seed}"
        expected.pop("lm_head.weight")
    assert set(ours) == set(expected), f"seed={seed}: {set(ours) ^ set(expected)}"
    for name, tensor in ours.items():
        assert tensor.shape == expected[name].shape, f"seed={seed}: {name}"
        assert torch.equal(tensor.float(), expected[name]), f"seed={seed}: {name} differs"

    config, ref = files.hf_config, reference.config
    assert config["architectures"] == [type(reference).__name__]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert config[key] == getattr(ref, key), f"seed={seed}: {key}"
    # Qwen2Config has no head_dim attribute: it is implied.
    ref_head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
    assert config["head_dim"] == ref_head_dim, f"seed={seed}"
    assert config["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert config["rope_theta"] == pytest.approx(ref.rope_parameters["rope_theta"], rel=1e-6)


def test_tokenizer_comes_from_gguf_metadata(tmp_path: Path) -> None:
    path, _ = write(tmp_path, TinyGguf())
    tokenizer = load_model_files(path).tokenizer
    assert tokenizer.is_fast
    assert tokenizer.chat_template == TINY_CHAT_TEMPLATE
    # The two merges apply, control tokens stay whole, bytes round-trip.
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("the", add_special_tokens=False))
    assert pieces == ["t", "he"]
    text = "<|bos|>user\nhé 🙂 the<|eos|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 258 and ids[-1] == 259
    assert tokenizer.decode(ids) == text


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"definitely not a gguf file" * 10)
    return path


def _truncated(tmp_path: Path) -> Path:
    path, _ = write(tmp_path, TinyGguf(), name="truncated.gguf")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _spec_file(spec: TinyGguf, name: str):
    return lambda tmp_path: write(tmp_path, spec, name=name)[0]


BAD_FILES = {
    "unreadable": (_garbage, "not a readable GGUF"),
    "truncated": (_truncated, "not a readable GGUF"),
    "unsupported-type": (
        _spec_file(TinyGguf(types={"blk.1.attn_v.weight": GgmlType.Q5_K}), "q5k.gguf"),
        "'blk.1.attn_v.weight' has unsupported type Q5_K",
    ),
    "unsupported-arch": (
        _spec_file(TinyGguf(arch="falcon"), "falcon.gguf"),
        "unsupported GGUF architecture 'falcon'",
    ),
    "unknown-tensor": (
        _spec_file(TinyGguf(extra_tensors=("rope_freqs.weight",)), "ropefreqs.gguf"),
        "'rope_freqs.weight' has no known Hugging Face counterpart",
    ),
    "split": (
        _spec_file(TinyGguf(split_count=3), "tiny-00001-of-00003.gguf"),
        "part 1 of a GGUF split into 3 files",
    ),
    "rope-scaling": (
        _spec_file(TinyGguf(rope_scaling=RopeScalingType.LINEAR), "linear.gguf"),
        "RoPE scaling type 'linear' is not supported",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=str)
def test_bad_gguf_gives_error_naming_the_file(tmp_path: Path, case: str) -> None:
    make, problem = BAD_FILES[case]
    path = make(tmp_path)
    with pytest.raises(ModelLoadError) as error:
        load_model_files(path)
    assert path.name in str(error.value)
    assert problem in str(error.value)
