"""Reading a PEFT LoRA adapter: ``adapter_config.json`` + ``adapter_model.safetensors``.

Only what Octavo serves is accepted; everything else is refused with a message that names
the problem (``LoRAError``), so a bad adapter never reaches a step:

- weights in safetensors only (a ``.bin`` is a pickle: running it could run code);
- LoRA on the attention and MLP projections (``q/k/v/o_proj``, ``gate/up/down_proj``),
  which Octavo packs into ``qkv_proj`` and ``gate_up_proj`` (each slice keeps its own A/B);
- no ``modules_to_save`` (a replaced embedding or LM head), no embedding or LM-head LoRA,
  no DoRA, no bias, no per-module rank or alpha patterns;
- rank at most ``--max-lora-rank``, finite values, and shapes that fit the base model
  (checked when the adapter is placed in a slot: ``octavo.lora.manager``).

The scaling (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``) is
folded into B here, as vLLM does, so the kernels never see it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may target, by their HF (and PEFT) names.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj")
_PREFIX = "base_model.model."


class LoRAError(ValueError):
    """An adapter Octavo refuses; the message names the adapter and the problem."""


@dataclass
class LoRAWeights:
    """One projection's adapter: ``a [r, in]`` and ``b [out, r]`` with the scaling in it."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass
class LoRAAdapter:
    """A loaded adapter: its rank, and its weights by HF module name
    (``model.layers.0.self_attn.q_proj``)."""

    path: str
    rank: int
    weights: dict[str, LoRAWeights]


def adapter_files(path: str) -> tuple[Path, Path]:
    """The config and weights files of the adapter at ``path``, or ``LoRAError`` saying
    which is missing (or that the weights are a pickle)."""
    folder = Path(path)
    if not folder.is_dir():
        raise LoRAError(f"LoRA adapter {path!r}: not a folder")
    config, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config.is_file():
        raise LoRAError(f"LoRA adapter {path!r}: no {CONFIG_FILE}")
    if not weights.is_file():
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        if pickled:
            raise LoRAError(f"LoRA adapter {path!r}: {pickled[0]} is a pickle file, which "
                            f"Octavo does not load (it can run code); save the adapter "
                            f"with safetensors ({WEIGHTS_FILE})")
        raise LoRAError(f"LoRA adapter {path!r}: no {WEIGHTS_FILE}")
    return config, weights


def adapter_digest(path: str) -> str:
    """sha256 of the adapter's config and weights: what the prefix cache keys it by."""
    digest = hashlib.sha256()
    for file in adapter_files(path):
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def read_adapter_config(path: str, max_rank: int) -> tuple[int, float]:
    """The adapter's rank and scaling, after refusing what Octavo does not serve."""
    config_file, _ = adapter_files(path)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not a JSON object")
    _check_config(path, config)
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoRAError(f"LoRA adapter {path!r}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoRAError(f"LoRA adapter {path!r}: rank {rank} is above --max-lora-rank "
                        f"{max_rank}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise LoRAError(f"LoRA adapter {path!r}: lora_alpha must be positive, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _check_config(path: str, config: dict) -> None:
    refused = [
        ("peft_type is not LORA", config.get("peft_type", "LORA") != "LORA"),
        ("modules_to_save (a replaced embedding or LM head) is not supported",
         bool(config.get("modules_to_save"))),
        ("DoRA (use_dora) is not supported", bool(config.get("use_dora"))),
        ("LoRA biases (bias other than 'none') are not supported",
         config.get("bias", "none") != "none"),
        ("per-module ranks or alphas (rank_pattern, alpha_pattern) are not supported",
         bool(config.get("rank_pattern")) or bool(config.get("alpha_pattern"))),
    ]
    for what, present in refused:
        if present:
            raise LoRAError(f"LoRA adapter {path!r}: {what}")


def load_adapter(path: str, max_rank: int) -> LoRAAdapter:
    """The adapter at ``path`` (``LoRAError`` if it is refused), B scaled."""
    rank, scaling = read_adapter_config(path, max_rank)
    _, weights_file = adapter_files(path)
    try:
        tensors = load_file(os.fspath(weights_file))
    except Exception as exc:  # safetensors raises its own error types
        raise LoRAError(f"LoRA adapter {path!r}: {WEIGHTS_FILE} does not load ({exc})") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, part = _split_key(path, key)
        pairs.setdefault(module, {})[part] = tensor
    weights = {module: _weights(path, module, parts, rank, scaling)
               for module, parts in pairs.items()}
    if not weights:
        raise LoRAError(f"LoRA adapter {path!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return LoRAAdapter(path=path, rank=rank, weights=weights)


def _split_key(path: str, key: str) -> tuple[str, str]:
    """``(HF module name, "lora_A" | "lora_B")`` of a PEFT tensor name."""
    name = key.removeprefix(_PREFIX)
    for part in ("lora_A", "lora_B"):
        suffix = f".{part}.weight"
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            if module.rsplit(".", 1)[-1] not in SUPPORTED_MODULES:
                raise LoRAError(f"LoRA adapter {path!r}: {key}: LoRA on "
                                f"{module.rsplit('.', 1)[-1]} is not supported (only "
                                f"{', '.join(SUPPORTED_MODULES)})")
            return module, part
    raise LoRAError(f"LoRA adapter {path!r}: tensor {key} is not supported (embedding and "
                    f"LM-head adapters, modules_to_save and biases are refused)")


def _weights(path: str, module: str, parts: dict[str, torch.Tensor], rank: int,
             scaling: float) -> LoRAWeights:
    if set(parts) != {"lora_A", "lora_B"}:
        raise LoRAError(f"LoRA adapter {path!r}: {module} has {sorted(parts)}, needs both "
                        f"lora_A and lora_B")
    a, b = parts["lora_A"].float(), parts["lora_B"].float()
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
        raise LoRAError(f"LoRA adapter {path!r}: {module} has lora_A {tuple(a.shape)} and "
                        f"lora_B {tuple(b.shape)}, not [r, in] and [out, r] with r={rank}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise LoRAError(f"LoRA adapter {path!r}: {module} holds NaN or Inf values")
    return LoRAWeights(a=a, b=b * scaling)
