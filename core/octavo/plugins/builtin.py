"""The core's built-ins, registered through the same hooks as any third-party plugin."""

from __future__ import annotations

from typing import Any

from octavo.plugins.hookspecs import hookimpl
from octavo.plugins.registry import Registry


@hookimpl
def octavo_register_platforms(registry: Registry[Any]) -> None:
    from octavo.platforms.cpu import CpuPlatform

    registry.register(CpuPlatform.name, CpuPlatform)


@hookimpl
def octavo_register_scheduling_policies(registry: Registry[Any]) -> None:
    from octavo.sched.policy import FcfsPolicy, PriorityPolicy

    for policy in (FcfsPolicy, PriorityPolicy):
        registry.register(policy.name, policy)


@hookimpl
def octavo_register_schedulers(registry: Registry[Any]) -> None:
    from octavo.sched.scheduler import Scheduler

    registry.register("default", Scheduler)


@hookimpl
def octavo_register_kv_managers(registry: Registry[Any]) -> None:
    from octavo.kv.manager import KVCacheManager

    registry.register("default", KVCacheManager)


@hookimpl
def octavo_register_attention_backends(registry: Registry[Any]) -> None:
    from octavo.attention.torch_backend import TorchAttentionBackend

    registry.register(TorchAttentionBackend.name, TorchAttentionBackend)


@hookimpl
def octavo_register_models(registry: Registry[Any]) -> None:
    from octavo.models.llama import (
        LlamaForCausalLM,
        MistralForCausalLM,
        Qwen2ForCausalLM,
        Qwen3ForCausalLM,
    )
    from octavo.models.mixtral import MixtralForCausalLM

    for model in (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
                  MixtralForCausalLM):
        registry.register(model.__name__, model)
