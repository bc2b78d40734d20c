"""Loading a GGUF file (llama.cpp's format) as ModelFiles, through the conversion cache."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from gguf import ReaderTensor
from safetensors import SafetensorError, safe_open

from octavo.models.loader import gguf_cache
from octavo.models.loader.config_ranges import check_config_ranges
from octavo.models.loader.dequant import BLOCK_FORMATS, SUPPORTED_TYPES, GgmlType
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.files import ModelFiles, WeightSource
from octavo.models.loader.gguf_config import synthesize_hf_config
from octavo.models.loader.gguf_metadata import GgufFile
from octavo.models.loader.gguf_names import ARCHITECTURES, GgufArchitecture, hf_tensor_name
from octavo.models.loader.gguf_weights import GgufWeights
from octavo.models.loader.hf_folder import load_hf_folder
from octavo.models.loader.quantized import GgufTensor, Weight
from octavo.models.loader.tokenizer import load_gguf_tokenizer


def load_gguf(path: Path) -> ModelFiles:
    """The GGUF's model, from its conversion cache entry (made on the first load)."""
    entry = gguf_cache.lookup(path)
    if entry is not None:
        try:
            return _from_entry(path, entry)
        except ModelLoadError as e:
            gguf_cache.discard(entry, str(e))
    files = read_gguf(path)
    entry = gguf_cache.store(path, files)
    return files if entry is None else _from_entry(path, entry)


def _from_entry(path: Path, entry: Path) -> ModelFiles:
    cached = load_hf_folder(entry)
    weights = EntryWeights(path, cached.weights, _entry_types(entry))
    return ModelFiles(path, cached.hf_config, cached.tokenizer, weights, quantization="gguf")


def _entry_types(entry: Path) -> dict[str, int]:
    """The GGUF types of the weights an entry keeps as blocks (from its metadata)."""
    try:
        with safe_open(entry / gguf_cache.WEIGHTS, "pt") as weights:
            types = json.loads((weights.metadata() or {})[gguf_cache.GGML_TYPES])
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise ModelLoadError(f"{entry}: no readable GGUF types in its weights: {e}") from None
    if not isinstance(types, dict) or not all(isinstance(t, int) for t in types.values()):
        raise ModelLoadError(f"{entry}: its GGUF types are not a name -> type mapping")
    return types


class EntryWeights:
    """A cache entry's weights, attributed to the GGUF they came from: errors about a weight
    name the file the user gave, not the cache. The blocks of a quantized weight come back
    as the ``GgufTensor`` the GGUF loader yielded."""

    def __init__(self, gguf: Path, weights: WeightSource, types: dict[str, int]) -> None:
        self.gguf = gguf
        self.weights = weights
        self.types = types  # weight name -> GGUF type, for the weights stored as blocks

    def __len__(self) -> int:
        return len(self.weights)

    def __iter__(self) -> Iterator[tuple[str, Weight]]:
        for name, tensor in self.weights:
            ggml_type = self.types.get(name)
            if ggml_type is None or not isinstance(tensor, torch.Tensor):
                yield name, tensor
                continue
            fmt = BLOCK_FORMATS[GgmlType(ggml_type)]
            cols = tensor.shape[1] // fmt.block_bytes * fmt.block_elems
            yield name, GgufTensor(ggml_type, tensor, (tensor.shape[0], cols))

    def file_of(self, name: str) -> Path:
        self.weights.file_of(name)  # raises for a name the entry does not hold
        return self.gguf


def read_gguf(path: Path) -> ModelFiles:
    """Read a GGUF's metadata, check every tensor can be loaded, and build its tokenizer.

    All checks happen here, before any weight is dequantized, so a bad file fails at once.
    """
    gguf = GgufFile(path)
    parts = gguf.get("split.count", 1)
    if parts > 1:
        raise ModelLoadError(
            f"{path}: is part 1 of a GGUF split into {parts} files; merge them into one first "
            "(llama.cpp's `llama-gguf-split --merge`)"
        )
    arch = ARCHITECTURES.get(gguf.architecture)
    if arch is None:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {gguf.architecture!r}; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    config = synthesize_hf_config(gguf, arch)
    check_config_ranges(config, path)
    tensors = _hf_named_tensors(gguf, arch)
    permuted_heads = _permuted_heads(gguf, config, tensors) if arch.permuted_qk else {}
    weights = GgufWeights(gguf, tensors, permuted_heads, arch.norm_shift)
    tokenizer = load_gguf_tokenizer(path, gguf.get("tokenizer.chat_template"))
    return ModelFiles(path, config, tokenizer, weights, quantization="gguf")


def _hf_named_tensors(gguf: GgufFile, arch: GgufArchitecture) -> dict[str, ReaderTensor]:
    supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
    named = {}
    for tensor in gguf.tensors.values():
        if tensor.name in arch.config_tensors:
            continue  # read into the config
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{gguf.path}: tensor {tensor.name!r} has unsupported type "
                f"{tensor.tensor_type.name}; supported: {supported}"
            )
        name = hf_tensor_name(tensor.name, arch)
        if name is None:
            raise ModelLoadError(
                f"{gguf.path}: tensor {tensor.name!r} has no known Hugging Face counterpart "
                f"for GGUF architecture {gguf.architecture!r}"
            )
        named[name] = tensor
    return named


def _permuted_heads(
    gguf: GgufFile, config: dict[str, Any], tensors: dict[str, ReaderTensor]
) -> dict[str, int]:
    """Head counts of the Q and K projections (weights and biases) that llama.cpp permuted."""
    counts = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    heads = {}
    for name, tensor in tensors.items():
        proj = name.split(".")[-2]
        if proj not in counts:
            continue
        rows = int(tensor.shape[-1])  # GGUF lists dimensions fastest-first
        if rows % (2 * counts[proj]):
            raise ModelLoadError(
                f"{gguf.path}: tensor {tensor.name!r} has {rows} rows, which do not split "
                f"into {counts[proj]} heads of rotary pairs"
            )
        heads[name] = counts[proj]
    return heads
