"""Fixtures shared across the core tests."""

from __future__ import annotations

import copy

import pytest
import torch

from octavo.models.loader import default_model_path


@pytest.fixture(scope="session")
def smollm2_hf() -> torch.nn.Module:
    """HF transformers' own load of the default SmolLM2 GGUF, fp32: the parity reference.
    Slow (dequantization in transformers), so loaded once per session."""
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_hf64(smollm2_hf: torch.nn.Module) -> torch.nn.Module:
    """The same model in fp64: logits exact to well below fp32's rounding."""
    return copy.deepcopy(smollm2_hf).double()


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's torch ops on one thread: small tensors are far faster that way than
    on threads that contend for a busy CPU (use with ``pytest.mark.usefixtures``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
