"""The attention conformance contract (octavo.testing) against the ``nki`` backend, its
kernels run in the NKI emulator; fp32, as the engine runs in emulation."""

from __future__ import annotations

from octavo.testing import AttentionBackendContract
from octavo_neuron.backend import NkiAttentionBackend


class TestNkiAttention(AttentionBackendContract):
    backend = NkiAttentionBackend
