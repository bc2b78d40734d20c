"""The core's built-ins, registered through the same hooks as any third-party plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.plugins.hookspecs import hookimpl
from octavo.plugins.registry import Registry

if TYPE_CHECKING:

    from octavo.attention.base import AttentionBackend
    from octavo.kv.interface import KVCacheManagerInterface
    from octavo.models.base import CausalLM
    from octavo.platforms.base import Platform
    from octavo.sched.interface import SchedulerInterface
    from octavo.sched.policy import SchedulingPolicy


@hookimpl
def octavo_register_platforms(registry: Registry[type[Platform]]) -> None:
    from octavo.cpu.platform import CpuPlatform

    registry.register(CpuPlatform.name, CpuPlatform)


@hookimpl
def octavo_register_scheduling_policies(registry: Registry[type[SchedulingPolicy]]) -> None:
    from octavo.sched.policy import FcfsPolicy, PriorityPolicy

    for policy in (FcfsPolicy, PriorityPolicy):
        registry.register(policy.name, policy)


@hookimpl
def octavo_register_schedulers(registry: Registry[type[SchedulerInterface]]) -> None:
    from octavo.sched.scheduler import Scheduler

    registry.register("default", Scheduler)


@hookimpl
def octavo_register_kv_managers(registry: Registry[type[KVCacheManagerInterface]]) -> None:
    from octavo.kv.manager import KVCacheManager

    registry.register("default", KVCacheManager)


@hookimpl
def octavo_register_attention_backends(registry: Registry[type[AttentionBackend]]) -> None:
    from octavo.attention.torch_backend import TorchAttentionBackend
    from octavo.cpu.attention import CpuAttentionBackend

    for backend in (TorchAttentionBackend, CpuAttentionBackend):
        registry.register(backend.name, backend)


@hookimpl
def octavo_register_models(registry: Registry[type[CausalLM]]) -> None:
    from octavo.models.architectures import BUILTIN_ARCHITECTURES

    for name, model in BUILTIN_ARCHITECTURES.items():
        registry.register(name, model)
