"""LoRA adapters written by the real ``peft`` package on a tiny HF model, for the tests.

``init_lora_weights=False`` makes PEFT draw both A and B at random (its default leaves B
zero, an adapter that changes nothing), so an engine that dropped or misplaced a delta
would give other tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class AdapterSpec:
    rank: int
    alpha: float
    modules: list[str] = field(default_factory=lambda: list(ALL_MODULES))
    rslora: bool = False


# Four adapters: ranks 8 and 16, rsLoRA, and one on a subset of the projections.
SPECS = [AdapterSpec(8, 16), AdapterSpec(16, 8, rslora=True),
         AdapterSpec(16, 32, modules=["q_proj", "v_proj", "down_proj"]), AdapterSpec(8, 8)]


def make_adapter(base: torch.nn.Module, spec: AdapterSpec, folder: Path,
                 seed: int) -> PeftModel:
    """PEFT's adapter on a copy of ``base`` (random A and B from ``seed``), saved to
    ``folder`` in safetensors; the returned model computes base + adapter."""
    torch.manual_seed(seed)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=spec.modules,
                        use_rslora=spec.rslora, init_lora_weights=False, lora_dropout=0.0)
    model = get_peft_model(copy.deepcopy(base), config)
    model.save_pretrained(folder, safe_serialization=True)
    return model.eval()
