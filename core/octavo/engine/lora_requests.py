"""The front end's LoRA checks, shared by ``LLMEngine`` and ``AsyncLLM``: a request's
``LoRARequest`` becomes the checked ``LoRAAdapterRef`` its engine requests carry, or an
``InvalidRequestError`` naming the adapter and the problem (the client's fault, a 400).

The adapter code (torch, safetensors) is imported only by an engine with ``enable_lora``,
so a front end without it starts as before."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from octavo.config import EngineConfig
from octavo.engine.errors import InvalidRequestError
from octavo.lora_request import LoRAAdapterRef, LoRARequest

if TYPE_CHECKING:
    from octavo.lora.registry import AdapterRegistry


def lora_registry(config: EngineConfig, hf_config: dict[str, Any]) -> AdapterRegistry | None:
    """The registry that checks a model's adapters; None without ``enable_lora``."""
    if not config.lora.enable_lora:
        return None
    from octavo.lora.registry import AdapterRegistry

    return AdapterRegistry(hf_config, config.lora.max_lora_rank)


def lora_ref(adapters: AdapterRegistry | None,
             request: LoRARequest | None) -> LoRAAdapterRef | None:
    """The checked adapter a request runs with (None: the base model)."""
    if request is None:
        return None
    if adapters is None:
        raise InvalidRequestError(f"LoRA adapter {request.lora_name!r} requested, but this "
                                  f"engine runs without enable_lora")
    from octavo.lora.adapter import LoRAError

    try:
        return adapters.ref(request)
    except LoRAError as exc:
        raise InvalidRequestError(str(exc)) from None
