"""What names a LoRA adapter: the user's ``LoRARequest`` and the engine's ``LoRAAdapterRef``.

Plain data at the bottom of the core: the front end turns a ``LoRARequest`` into a
``LoRAAdapterRef`` (adding the digest of the adapter's files), which travels with the
``Request`` to the scheduler and, in ``NewRequestData``, to the workers that load it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter a request runs with, as in vLLM: ``LoRARequest(name, id, path)``.
    ``lora_path`` is a local folder with ``adapter_config.json`` and
    ``adapter_model.safetensors``."""

    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass(frozen=True)
class LoRAAdapterRef:
    """An adapter as the engine knows it. ``digest`` (sha256 of its config and weights)
    is what the prefix cache and the workers key it by, never the name or id: a name
    re-loaded with new weights is a new adapter (vLLM's bugs #30931, #42125)."""

    name: str
    path: str
    digest: str
