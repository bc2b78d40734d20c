"""``load_model_files``: pick the loader for what the user named as ``--model``."""

from __future__ import annotations

import os
from pathlib import Path

from octavo.models.loader.default_model import default_model_path
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.files import ModelFiles
from octavo.models.loader.gguf_file import load_gguf
from octavo.models.loader.hf_folder import load_hf_folder


def load_model_files(model: str | os.PathLike[str] | None) -> ModelFiles:
    """None -> the default model; a folder -> an HF model folder; a ``*.gguf`` file -> GGUF."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        return load_hf_folder(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    if path.suffix.lower() == ".gguf":
        return load_gguf(path)
    raise ModelLoadError(
        f"{path}: not a model; expected a Hugging Face model folder or a .gguf file"
    )
