"""Bad model input gives a ``ModelLoadError`` that names the file, the weight and the problem."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.models.build import build_model
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_folder(tmp_path: Path, arch: str = "llama") -> Path:
    save_tiny_model(arch, tmp_path, seed=draw_seed())
    return tmp_path


def edit_weights(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def edit_config(folder: Path, edit) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def build(folder: Path):
    return build_model(load_model_files(folder), torch.float32, TorchAttentionBackend)


def test_unknown_architecture_names_config_and_supported_ones(tmp_path):
    folder = tiny_folder(tmp_path)
    edit_config(folder, lambda config: config.update(architectures=["FooForCausalLM"]))
    with pytest.raises(ModelLoadError) as error:
        build(folder)
    message = str(error.value)
    assert str(folder / "config.json") in message
    assert "FooForCausalLM" in message
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                      "Qwen3ForCausalLM", "MixtralForCausalLM"):
        assert supported in message


@pytest.mark.parametrize("arch, name, shape, expected", [
    ("llama", "model.layers.1.self_attn.k_proj.weight", (16, 64), (32, 64)),
    ("llama", "model.layers.0.mlp.up_proj.weight", (128, 63), (128, 64)),
    ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w2.weight", (64, 48), (64, 96)),
])
def test_mismatched_shape_names_weight_shapes_and_file(tmp_path, arch, name, shape, expected):
    folder = tiny_folder(tmp_path, arch)
    edit_weights(folder, lambda tensors: tensors.update({name: torch.randn(shape)}))
    with pytest.raises(ModelLoadError) as error:
        build(folder)
    message = str(error.value)
    for part in (name, str(expected), str(shape), str(folder / "model.safetensors")):
        assert part in message, message


def test_missing_weight_is_named(tmp_path):
    folder = tiny_folder(tmp_path, "mixtral")
    missing = ["model.layers.0.self_attn.v_proj.weight",
               "model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    edit_weights(folder, lambda tensors: [tensors.pop(name) for name in missing])
    with pytest.raises(ModelLoadError) as error:
        build(folder)
    message = str(error.value)
    assert str(folder) in message and "missing" in message
    for name in missing:
        assert name in message


def test_unexpected_weight_is_named(tmp_path):
    folder = tiny_folder(tmp_path)
    name = "model.layers.0.self_attn.rope_scale.weight"
    edit_weights(folder, lambda tensors: tensors.update({name: torch.randn(4)}))
    with pytest.raises(ModelLoadError, match="unexpected") as error:
        build(folder)
    assert name in str(error.value) and "model.safetensors" in str(error.value)


@pytest.mark.parametrize("edit, field", [
    (lambda config: config.pop("hidden_size"), "hidden_size"),
    (lambda config: config.update(num_attention_heads=0), "num_attention_heads"),
    (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
    (lambda config: config.update(model_type=["llama"]), "model_type"),  # was a TypeError
    (lambda config: config.update(rope_parameters={"rope_type": "proportional",
                                                   "factor": 4.0}),
     "rope_parameters"),
])
def test_bad_config_field_is_named(tmp_path, edit, field):
    # Edited after loading: the config is checked by build_model, not by the loader.
    files = load_model_files(tiny_folder(tmp_path))
    config = dict(files.hf_config)
    edit(config)
    with pytest.raises(ModelLoadError) as error:
        build_model(replace(files, hf_config=config), torch.float32, TorchAttentionBackend)
    assert field in str(error.value) and "config.json" in str(error.value)


def test_dimensions_the_layers_cannot_split_are_reported(tmp_path):
    folder = tiny_folder(tmp_path)
    edit_config(folder, lambda config: config.update(num_key_value_heads=3))
    with pytest.raises(ModelLoadError, match="num_key_value_heads.: 3 does not divide") as error:
        build(folder)
    assert "config.json" in str(error.value)
