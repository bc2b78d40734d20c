"""Building an engine's parts from its config: the worker's classes and the scheduler with
its KV manager, policy and connector, each looked up by the name the config holds
(``octavo.plugins.resolve``)."""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.kv_transfer.base import KVConnector, KVConnectorRole
from octavo.platforms import Platform
from octavo.plugins import Registries
from octavo.plugins.resolve import (
    attention_backend,
    check_names,
    kv_manager_cls,
    scheduler_cls,
)
from octavo.qualname import resolve_qualname
from octavo.sched.interface import SchedulerInterface
from octavo.sched.policy import SchedulingPolicy
from octavo.sched.structured_outputs import StructuredOutputManager
from octavo.worker.interface import WorkerClasses, WorkerInterface


def worker_cls(platform: type[Platform]) -> type[WorkerInterface]:
    """The class ``platform.worker_cls`` names, imported now."""
    return resolve_qualname(platform.worker_cls)  # type: ignore[no-any-return]


def worker_classes(config: EngineConfig, platform: type[Platform],
                   registries: Registries) -> WorkerClasses:
    """What a worker of ``platform`` runs, from ``config``'s names."""
    check_names(config, registries, platform)
    return WorkerClasses(
        attn_backend=attention_backend(config, platform, registries),
        architectures=registries.models.as_dict(),
        proposer=(registries.proposers.get(config.speculative.method)
                  if config.speculative is not None else None),
        kv_connector=(registries.kv_connectors.get(config.kv_transfer.connector)
                      if config.kv_transfer is not None else None),
    )


def build_scheduler(config: EngineConfig, registries: Registries,
                    structured_output: StructuredOutputManager | None,
                    ) -> SchedulerInterface:
    """The scheduler ``config`` names, with its KV manager, policy and connector built; the
    KV cache must be sized (``config.cache.num_gpu_blocks``)."""
    num_blocks = config.cache.num_gpu_blocks
    assert num_blocks is not None, "the KV cache is not sized yet"
    block_size = config.cache.block_size
    kv_manager = kv_manager_cls(config, registries)(
        num_blocks, block_size, enable_caching=config.cache.enable_prefix_caching)
    policy_cls: type[SchedulingPolicy] = registries.scheduling_policies.get(
        config.scheduler.scheduling_policy)
    connector: KVConnector | None = None
    if config.kv_transfer is not None:
        connector_cls = registries.kv_connectors.get(config.kv_transfer.connector)
        connector = connector_cls(config.kv_transfer, KVConnectorRole.SCHEDULER, block_size)
    return scheduler_cls(config, registries)(
        config, kv_manager, policy=policy_cls(), kv_connector=connector,
        structured_output=structured_output)
