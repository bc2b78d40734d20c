"""Configuration: one dataclass per part of the engine, composed into ``EngineConfig``.

Bottom layer, beside the plain data: imports only the standard library (torch inside
``ModelConfig.torch_dtype``, when a dtype is resolved). Parsing a config never loads
plugins; the names it holds (backend, attention backend, scheduler, KV manager, policy,
connector, proposer) are resolved when the engine is built (``octavo.plugins.resolve``).
"""

from octavo.config.cache import CacheConfig
from octavo.config.device import PLATFORM_CHOICES, DeviceConfig
from octavo.config.engine import EngineConfig
from octavo.config.errors import ConfigError
from octavo.config.kv_transfer import KVTransferConfig
from octavo.config.lora import LoRAConfig
from octavo.config.model import DTYPES, ModelConfig
from octavo.config.observability import ObservabilityConfig
from octavo.config.parallel import ParallelConfig
from octavo.config.parse import parse_memory
from octavo.config.pooler import POOLING_TYPES, PoolerConfig
from octavo.config.scheduler import SchedulerConfig
from octavo.config.speculative import SpeculativeConfig
from octavo.config.structured_outputs import StructuredOutputsConfig

__all__ = [
    "PLATFORM_CHOICES",
    "DTYPES",
    "CacheConfig",
    "ConfigError",
    "DeviceConfig",
    "EngineConfig",
    "KVTransferConfig",
    "LoRAConfig",
    "ModelConfig",
    "ObservabilityConfig",
    "POOLING_TYPES",
    "ParallelConfig",
    "PoolerConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "StructuredOutputsConfig",
    "parse_memory",
]
