"""Where Octavo keeps files between runs: one user cache folder, ``$OCTAVO_CACHE_DIR`` or the
platform's (``~/.cache/octavo`` on Linux). The GGUF conversion cache and the CPU kernels'
compiled library live under it."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "OCTAVO_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("octavo"))
