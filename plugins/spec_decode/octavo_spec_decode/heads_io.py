"""Reading and writing head checkpoints in their published layouts (Medusa, EAGLE).

Both projects publish a folder with a ``config.json`` and one weight file, either
safetensors or a pickled ``torch.save`` state dict (``.pt`` / ``.bin``). This module only
knows files and tensor names; what the names mean lives in ``medusa.py`` and ``eagle.py``.
Every error names the file and, where there is one, the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class HeadCheckpointError(ValueError):
    """A head checkpoint that does not match its published layout."""


def read_config(folder: Path) -> dict[str, Any]:
    """The ``config.json`` object of a head folder."""
    path = folder / "config.json"
    if not path.is_file():
        raise HeadCheckpointError(f"{path}: missing (a head folder needs its config.json)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise HeadCheckpointError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise HeadCheckpointError(f"{path}: must hold a JSON object")
    return config


def config_int(config: Mapping[str, Any], key: str, folder: Path,
               default: int | None = None) -> int:
    """A positive integer field of ``config.json``, with an error naming it."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HeadCheckpointError(f"{folder / 'config.json'}: {key!r} must be a positive "
                                  f"integer, got {value!r}")
    return value


def find_weights(folder: Path, names: Sequence[str]) -> Path:
    """The first of ``names`` present in ``folder`` (publishers use several)."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise HeadCheckpointError(f"{folder}: no weight file; expected one of {', '.join(names)}")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file or a ``torch.save``d state dict."""
    try:
        if path.suffix == ".safetensors":
            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError) as exc:
        raise HeadCheckpointError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise HeadCheckpointError(f"{path}: is not a state dict of tensors")
    return dict(state)


def check_layout(path: Path, tensors: Mapping[str, torch.Tensor],
                 expected: Mapping[str, tuple[int, ...]], optional: Set[str] = frozenset(),
                 ) -> None:
    """Every expected tensor present with its shape, nothing else (``optional`` may be
    absent)."""
    for name in tensors:
        if name not in expected:
            raise HeadCheckpointError(f"{path}: unexpected tensor {name!r} "
                                      f"(expected names like {next(iter(expected))!r})")
    for name, shape in expected.items():
        if name not in tensors:
            if name in optional:
                continue
            raise HeadCheckpointError(f"{path}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(shape):
            raise HeadCheckpointError(f"{path}: tensor {name!r} has shape "
                                      f"{tuple(tensors[name].shape)}, expected {tuple(shape)}")


def write_head(folder: Path, weights_name: str, tensors: Mapping[str, torch.Tensor],
               config: Mapping[str, Any]) -> None:
    """Write ``config.json`` and the weight file (safetensors or ``torch.save`` by suffix).

    Tensors that share storage (Medusa repeats one ResBlock) are written as copies, which
    is how safetensors stores them and what a reader expects."""
    folder.mkdir(parents=True, exist_ok=True)
    plain = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    if weights_name.endswith(".safetensors"):
        save_file(plain, folder / weights_name)
    else:
        torch.save(plain, folder / weights_name)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")


def draft_ids_from_d2t(path: Path, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids of a draft vocabulary stored as EAGLE-3's ``d2t`` (id - index), checked."""
    ids = torch.arange(len(d2t)) + d2t.long()
    if d2t.dim() != 1 or not len(d2t) or not 0 <= int(ids.min()) <= int(ids.max()) < vocab_size:
        raise HeadCheckpointError(f"{path}: tensor 'd2t' maps draft tokens outside the "
                                  f"vocabulary")
    return ids


def d2t_of(draft_token_ids: torch.Tensor) -> torch.Tensor:
    """The ``d2t`` tensor of a draft vocabulary (the inverse of ``draft_ids_from_d2t``)."""
    return draft_token_ids - torch.arange(len(draft_token_ids))
