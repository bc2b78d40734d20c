"""The attention conformance contract (octavo.testing) against the Triton backend: on a GPU
when torch sees one, else on the CPU under Triton's interpreter (switched on in
tests/conftest.py) - there in fp32 only, as the interpreter has no bf16 ``tl.dot``."""

from __future__ import annotations

import pytest
import torch

from octavo.testing import AttentionBackendContract
from octavo_triton.backend import TritonAttentionBackend

from .helpers import DEVICE


class TestTritonAttention(AttentionBackendContract):
    backend = TritonAttentionBackend
    device = str(DEVICE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tl.dot needs a GPU")
class TestTritonAttentionBf16(AttentionBackendContract):
    backend = TritonAttentionBackend
    device = "cuda"
    dtype = torch.bfloat16
