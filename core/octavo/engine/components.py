"""Building the engine core's scheduler from its config, with its KV manager, policy and
connector, each looked up by the name the config holds (``octavo.plugins.resolve``). The
workers' parts are the executor's (``octavo.executor.worker_factory``)."""

from __future__ import annotations

from collections.abc import Sequence

from octavo.config import EngineConfig
from octavo.distributed.state import RankInfo
from octavo.kv.cache_spec import FullAttentionSpec, KVCacheGroup, SSMStateSpec, is_hybrid
from octavo.kv.coordinator import KVCacheCoordinator
from octavo.kv.interface import KVCacheManagerInterface
from octavo.kv_transfer.base import KVConnector, KVConnectorRole
from octavo.plugins import Registries
from octavo.plugins.resolve import kv_connector_cls, kv_manager_cls, scheduler_cls
from octavo.sched.interface import SchedulerInterface
from octavo.sched.policy import SchedulingPolicy
from octavo.sched.pooling import PoolingScheduler
from octavo.sched.structured_outputs import StructuredOutputManager


def build_scheduler(config: EngineConfig, registries: Registries,
                    structured_output: StructuredOutputManager | None,
                    kv_groups: Sequence[KVCacheGroup] = (),
                    ssm_state: SSMStateSpec | None = None) -> SchedulerInterface:
    """The scheduler ``config`` names, with its KV manager, policy and connector built; the
    KV cache must be sized (``config.cache.num_gpu_blocks``). ``kv_groups`` and
    ``ssm_state``: the model's (``octavo.kv.cache_spec``); with several groups, a sliding window
    or SSM layers, the manager is the ``KVCacheCoordinator`` (with a state slot per
    ``max_num_seqs`` for SSM layers)."""
    num_blocks = config.cache.num_gpu_blocks
    assert num_blocks is not None, "the KV cache is not sized yet"
    block_size = config.cache.block_size
    kv_manager: KVCacheManagerInterface
    if (kv_groups and is_hybrid(kv_groups)) or ssm_state is not None:
        kv_manager = KVCacheCoordinator(
            num_blocks, block_size, config.cache.enable_prefix_caching,
            groups=kv_groups or [KVCacheGroup(FullAttentionSpec(), ())],
            num_state_slots=config.scheduler.max_num_seqs if ssm_state is not None else 0)
    else:
        kv_manager = kv_manager_cls(config, registries)(
            num_blocks, block_size, enable_caching=config.cache.enable_prefix_caching)
    policy_cls: type[SchedulingPolicy] = registries.scheduling_policies.get(
        config.scheduler.scheduling_policy)
    connector: KVConnector | None = None
    connector_class = kv_connector_cls(config, registries)
    if connector_class is not None:
        assert config.kv_transfer is not None
        connector = connector_class(config.kv_transfer, KVConnectorRole.SCHEDULER, block_size)
        connector.ranks = RankInfo(tp_size=config.parallel.tensor_parallel_size,
                                   pp_size=config.parallel.pipeline_parallel_size)
    # The pooling runner has its own (config refuses another --scheduler-cls with it).
    chosen = (PoolingScheduler if config.model.runner == "pooling"
              else scheduler_cls(config, registries))
    return chosen(config, kv_manager, policy=policy_cls(), kv_connector=connector,
                  structured_output=structured_output)
