"""The front end's adapters: a ``LoRARequest`` checked once and turned into the
``LoRAAdapterRef`` its requests carry.

Checking here, before a request reaches the engine core, keeps a bad adapter out of the
steps: its files, config, rank, values and shapes against the base model are refused with
the adapter's path and the problem, and the server goes on serving. The check is cached by
the files' size and modification time, so a request for a known adapter reads nothing.
"""

from __future__ import annotations

from typing import Any

from octavo.lora.adapter import (
    LoRAAdapter,
    LoRAError,
    adapter_digest,
    adapter_files,
    load_adapter,
)
from octavo.lora_request import LoRAAdapterRef, LoRARequest

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


class AdapterRegistry:
    """Refs of the adapters requests named (see the module docstring)."""

    def __init__(self, hf_config: dict[str, Any], max_lora_rank: int) -> None:
        self.shapes = projection_shapes(hf_config)
        self.num_layers = int(hf_config["num_hidden_layers"])
        self.max_lora_rank = max_lora_rank
        self._checked: dict[tuple, LoRAAdapterRef] = {}

    def ref(self, request: LoRARequest) -> LoRAAdapterRef:
        """The checked adapter of ``request`` (``LoRAError`` saying why it is refused)."""
        stamp = tuple((file.stat().st_size, file.stat().st_mtime_ns)
                      for file in adapter_files(request.lora_path))
        key = (request.lora_name, request.lora_path, stamp)
        ref = self._checked.get(key)
        if ref is None:
            self.check_shapes(load_adapter(request.lora_path, self.max_lora_rank))
            ref = LoRAAdapterRef(request.lora_name, request.lora_path,
                                 adapter_digest(request.lora_path))
            self._checked[key] = ref
        return ref

    def check_shapes(self, adapter: LoRAAdapter) -> None:
        """Refuse weights for modules the base model lacks or of shapes it does not take."""
        for module, weights in adapter.weights.items():
            parts = module.split(".")
            kind = parts[-1]
            if (len(parts) != 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit()
                    or int(parts[2]) >= self.num_layers
                    or parts[3] != ("self_attn" if kind in _ATTENTION else "mlp")):
                raise LoRAError(f"LoRA adapter {adapter.path!r}: {module} is not a module of "
                                f"the base model")
            out_features, in_features = self.shapes[kind]
            if weights.a.shape[1] != in_features or weights.b.shape[0] != out_features:
                raise LoRAError(
                    f"LoRA adapter {adapter.path!r}: {module} has lora_A "
                    f"{tuple(weights.a.shape)} and lora_B {tuple(weights.b.shape)}; the base "
                    f"model's {kind} is [{out_features}, {in_features}] (another base model?)")


def projection_shapes(hf_config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of each projection LoRA may target, from an HF config."""
    hidden = int(hf_config["hidden_size"])
    heads = int(hf_config["num_attention_heads"])
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    head_dim = int(hf_config.get("head_dim") or hidden // heads)
    inter = int(hf_config["intermediate_size"])
    return {"q_proj": (heads * head_dim, hidden), "k_proj": (kv_heads * head_dim, hidden),
            "v_proj": (kv_heads * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
            "down_proj": (hidden, inter)}



