"""The kernel tests run on a GPU when torch sees one, and otherwise on the CPU under
Triton's interpreter (switched on for the whole session in tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Interpreted kernels are numpy on small arrays: threads only contend (2-core CI)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
