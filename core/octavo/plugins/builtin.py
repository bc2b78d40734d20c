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
