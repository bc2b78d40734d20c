"""The port data-parallel engines that share an expert group meet on (torch-free: the front
end and headless nodes import it before any engine starts)."""

from __future__ import annotations

from dataclasses import replace

from octavo.config import EngineConfig
from octavo.engine.errors import EngineStartError
from octavo.net import free_port


def with_master_port(config: EngineConfig, has_remote: bool) -> EngineConfig:
    """The config with the port the engines' expert group meets on, where one is needed:
    a free one here when every engine runs on this node; headless nodes must be told."""
    parallel = config.parallel
    if not parallel.experts_across_engines or parallel.data_parallel_master_port is not None:
        return config
    if has_remote:
        raise EngineStartError("enable_expert_parallel with engines on headless nodes needs "
                               "--data-parallel-master-port (the same on every node)")
    return replace(config, parallel=replace(parallel, data_parallel_master_port=free_port()))
