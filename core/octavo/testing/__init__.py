"""``octavo.testing``: the conformance kit - contract tests that a plugin runs against its own
backend, platform, KV connector or proposer with one subclass in its test suite::

    from octavo.testing import AttentionBackendContract

    class TestMyBackend(AttentionBackendContract):
        backend = MyAttentionBackend

It holds :class:`AttentionBackendContract` (a backend against a dense fp64 reference),
:class:`PlatformContract` (availability, worker and memory of a platform class),
:class:`KVConnectorContract` (a connector's save/load round trip and its fallback when the
store fails) and :class:`ProposerContract` (speculative decoding keeps greedy outputs), plus
:func:`write_tiny_llama` (a tiny random Llama folder to run an engine on). A failure message
names the contract that broke and the seed that shows it (``--octavo-seed`` replays it).

The kit imports only ``octavo.plugin_api`` from Octavo (besides torch, numpy and pytest),
so it checks exactly what a plugin may rely on. It ships as the pytest plugin
``octavo.testing.plugin``; names here load lazily, so that plugin, which every pytest run
with Octavo installed loads, costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octavo.testing.attention import AttentionBackendContract
    from octavo.testing.kv_connector import KVConnectorContract
    from octavo.testing.platform import PlatformContract
    from octavo.testing.proposer import ProposerContract
    from octavo.testing.tiny_llama import write_tiny_llama

_EXPORTS = {
    "AttentionBackendContract": "octavo.testing.attention",
    "KVConnectorContract": "octavo.testing.kv_connector",
    "PlatformContract": "octavo.testing.platform",
    "ProposerContract": "octavo.testing.proposer",
    "write_tiny_llama": "octavo.testing.tiny_llama",
}

__all__ = ["AttentionBackendContract", "KVConnectorContract", "PlatformContract",
           "ProposerContract", "write_tiny_llama"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'octavo.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
