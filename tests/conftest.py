"""Session-wide test setup, loaded before any test module.

Without a GPU, Triton kernels run under Triton's interpreter. ``@triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is *defined*, and any test that fills the plugin
registries imports octavo-triton's kernels, so the switch must happen here, before the
first test module is collected - not in tests/triton/conftest.py.
"""

from __future__ import annotations

import importlib.util
import os

import torch

if not torch.cuda.is_available() and importlib.util.find_spec("octavo_triton") is not None:
    os.environ["TRITON_INTERPRET"] = "1"
    from octavo_triton.interpret import patch_interpreter

    patch_interpreter()
