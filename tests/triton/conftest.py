"""The kernel tests run on a GPU when torch sees one, and otherwise on the CPU under
Triton's interpreter - switched on here, before any kernel module is imported (the
``@triton.jit`` decorator reads ``TRITON_INTERPRET`` when a kernel is defined)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    from octavo_triton.interpret import patch_interpreter

    patch_interpreter()


@pytest.fixture(autouse=True)
def one_thread():
    """Interpreted kernels are numpy on small arrays: threads only contend (2-core CI)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
