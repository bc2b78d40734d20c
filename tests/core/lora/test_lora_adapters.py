"""Adapters Octavo refuses, each with a message naming the problem; and one it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from octavo.lora.adapter import LoRAError, load_adapter
from octavo.lora.registry import AdapterRegistry
from octavo.lora_request import LoRARequest

HF_CONFIG = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 96, "num_hidden_layers": 2}
PREFIX = "base_model.model.model.layers.0."


def write_adapter(folder: Path, config: dict | None = None,
                  tensors: dict[str, torch.Tensor] | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    base = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **(config or {})}))
    if tensors is None:
        tensors = {PREFIX + "self_attn.q_proj.lora_A.weight": torch.ones(4, 64),
                   PREFIX + "self_attn.q_proj.lora_B.weight": torch.ones(64, 4)}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return str(folder)


def test_reads_a_valid_adapter_with_scaling_folded_into_b(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "ok", {"use_rslora": True})
    adapter = load_adapter(path, max_rank=16)
    weights = adapter.weights["model.layers.0.self_attn.q_proj"]
    assert adapter.rank == 4 and torch.all(weights.b == 8 / 2)  # alpha / sqrt(r)
    ref = AdapterRegistry(HF_CONFIG, 16).ref(LoRARequest("ok", 1, path))
    assert ref.name == "ok" and len(ref.digest) == 64


@pytest.mark.parametrize(("config", "tensors", "message"), [
    ({"r": 32}, None, "rank 32 is above --max-lora-rank 16"),
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
    ({"use_dora": True}, None, "DoRA"),
    (None, {PREFIX + "self_attn.q_proj.lora_A.weight": torch.full((4, 64), float("nan")),
            PREFIX + "self_attn.q_proj.lora_B.weight": torch.ones(64, 4)}, "NaN or Inf"),
    (None, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(4, 10)},
     "not supported"),
    (None, {PREFIX + "self_attn.q_proj.lora_A.weight": torch.ones(4, 64)}, "needs both"),
    (None, {PREFIX + "self_attn.q_proj.lora_A.weight": torch.ones(4, 80),
            PREFIX + "self_attn.q_proj.lora_B.weight": torch.ones(64, 4)}, "another base model"),
])
def test_refuses_bad_adapters(tmp_path: Path, config: dict | None,
                              tensors: dict[str, torch.Tensor] | None, message: str) -> None:
    path = write_adapter(tmp_path / "bad", config, tensors)
    with pytest.raises(LoRAError, match=message):
        AdapterRegistry(HF_CONFIG, 16).ref(LoRARequest("bad", 1, path))


def test_refuses_pickles_and_missing_files(tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    torch.save({}, folder / "adapter_model.bin")
    with pytest.raises(LoRAError, match="adapter_model.bin is a pickle"):
        load_adapter(str(folder), 16)
    with pytest.raises(LoRAError, match="not a folder"):
        load_adapter(str(tmp_path / "absent"), 16)
