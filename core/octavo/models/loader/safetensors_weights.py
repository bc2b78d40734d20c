"""The weights of an HF folder: one model.safetensors, or shards listed by an index file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.json_file import read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class SafetensorsWeights:
    """Streams safetensors weights shard by shard; see ``ModelFiles.iter_weights``."""

    def __init__(self, folder: Path, files: dict[str, Path]) -> None:
        self.folder = folder
        self.files = files  # weight name -> the file that holds it, grouped by file

    @classmethod
    def open(cls, folder: Path) -> SafetensorsWeights:
        """Find the weight files and read their headers, so a missing or corrupt file fails
        here rather than midway through loading."""
        index = folder / INDEX_FILE
        if index.is_file():
            return cls._from_index(index)
        single = folder / SINGLE_FILE
        if single.is_file():
            return cls(folder, dict.fromkeys(_names_in(single), single))
        raise ModelLoadError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} in the model folder")

    @classmethod
    def _from_index(cls, index: Path) -> SafetensorsWeights:
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: has no 'weight_map' object naming the shards")
        files: dict[str, Path] = {}
        for shard_name in sorted(set(weight_map.values())):
            shard = index.parent / shard_name
            if not shard.is_file():
                raise ModelLoadError(f"{index}: references shard {shard_name!r}, which is missing")
            files.update(dict.fromkeys(_names_in(shard), shard))
        for name, shard_name in weight_map.items():
            if files.get(name) != index.parent / shard_name:
                raise ModelLoadError(f"{index}: says {name!r} is in {shard_name!r}, but it is not")
        return cls(index.parent, files)

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        by_file: dict[Path, list[str]] = {}
        for name, path in self.files.items():
            by_file.setdefault(path, []).append(name)
        for path, names in by_file.items():
            try:
                with safe_open(path, framework="pt") as f:
                    for name in names:
                        yield name, f.get_tensor(name)
            except SafetensorError as e:
                raise ModelLoadError(f"{path}: corrupt safetensors file: {e}") from e

    def file_of(self, name: str) -> Path:
        if name not in self.files:
            raise ModelLoadError(f"{self.folder}: no safetensors file holds weight {name!r}")
        return self.files[name]


def _names_in(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt") as f:
            return list(f.keys())
    except SafetensorError as e:
        raise ModelLoadError(f"{path}: not a readable safetensors file: {e}") from e
