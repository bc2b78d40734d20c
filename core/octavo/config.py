"""``EngineConfig``: every knob of an engine, validated once, with vLLM's names.

The parts are plain dataclasses. ``EngineConfig.from_kwargs`` takes the keywords a vLLM
user passes to ``LLM(...)`` (and the CLI flags map onto the same names), so scripts and
command lines carry over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from octavo.kv_transfer.config import KVTransferConfig
from octavo.sched.config import SchedulerConfig

if TYPE_CHECKING:
    import torch

    from octavo.spec.config import SpeculativeConfig  # spec.config imports ConfigError

# dtype names users type -> torch's name; torch is imported only when one is resolved, so
# a process that just parses a config (the server, before it spawns the core) need not.
DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32",
          "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "half": "float16", "fp16": "float16"}


class ConfigError(ValueError):
    """An engine setting is out of range or inconsistent; the message names it."""


@dataclass
class ModelConfig:
    model: str | None = None  # HF folder or .gguf; None = the default SmolLM2-135M-Instruct
    dtype: str = "auto"  # "auto" = the platform's default
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    seed: int = 0

    def torch_dtype(self, platform_default: str) -> torch.dtype:
        name = platform_default if self.dtype == "auto" else self.dtype
        if name not in DTYPES:
            raise ConfigError(f"dtype must be auto or one of {', '.join(DTYPES)}; got {name!r}")
        import torch

        return getattr(torch, DTYPES[name])


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None  # bytes for the KV cache; None = the platform default
    gpu_memory_utilization: float = 0.9  # devices: fraction of memory for weights + KV cache


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    backend: str = "auto"
    attention_backend: str | None = None  # None = the platform's own
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    scheduling_policy: str = "fcfs"
    enforce_eager: bool = False
    # A KV connector (disaggregated prefill/decode): JSON text or dict, parsed on init.
    kv_transfer_config: KVTransferConfig | dict[str, Any] | str | None = None
    # JSON text, a dict or a SpeculativeConfig; parsed in __post_init__. None = off.
    speculative_config: SpeculativeConfig | str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        from octavo.spec.config import SpeculativeConfig

        if self.kv_transfer_config is not None:
            self.kv_transfer_config = KVTransferConfig.parse(self.kv_transfer_config)
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self._validate()

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat vLLM-style keywords (``LLM(model=..., max_num_seqs=...)``)."""
        parts: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "parallel": {}}
        part_fields = {name: {f.name for f in fields(part)} for name, part in
                       (("model", ModelConfig), ("cache", CacheConfig),
                        ("parallel", ParallelConfig))}
        top = {f.name for f in fields(cls)} - set(parts)
        flat: dict[str, Any] = {}
        for key, value in kwargs.items():
            owner = next((p for p, names in part_fields.items() if key in names), None)
            if owner is not None:
                parts[owner][key] = value
            elif key in top:
                flat[key] = value
            else:
                raise ConfigError(f"unknown engine argument {key!r}")
        return cls(model=ModelConfig(**parts["model"]), cache=CacheConfig(**parts["cache"]),
                   parallel=ParallelConfig(**parts["parallel"]), **flat)

    def _validate(self) -> None:
        positive = {"max_num_seqs": self.max_num_seqs,
                    "max_num_batched_tokens": self.max_num_batched_tokens,
                    "block_size": self.cache.block_size,
                    "tensor_parallel_size": self.parallel.tensor_parallel_size,
                    "pipeline_parallel_size": self.parallel.pipeline_parallel_size}
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.model.max_model_len is not None and self.model.max_model_len < 1:
            raise ConfigError(f"max_model_len must be positive, got {self.model.max_model_len}")
        if self.cache.kv_cache_memory is not None and self.cache.kv_cache_memory <= 0:
            raise ConfigError(f"kv_cache_memory must be a positive number of bytes, "
                              f"got {self.cache.kv_cache_memory}")
        if not 0.0 < self.cache.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization must be in (0, 1], got "
                              f"{self.cache.gpu_memory_utilization}")
        if self.model.dtype != "auto" and self.model.dtype not in DTYPES:
            raise ConfigError(f"dtype must be auto or one of {', '.join(DTYPES)}; "
                              f"got {self.model.dtype!r}")
        if self.parallel.tensor_parallel_size * self.parallel.pipeline_parallel_size != 1:
            raise ConfigError("tensor and pipeline parallelism are not available yet; "
                              "use tensor_parallel_size=1 and pipeline_parallel_size=1")

    def scheduler_config(self, num_blocks: int, max_model_len: int) -> SchedulerConfig:
        from octavo.spec.config import SpeculativeConfig

        return SchedulerConfig(
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            block_size=self.cache.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            policy=self.scheduling_policy,
            enable_prefix_caching=self.cache.enable_prefix_caching,
            kv_transfer=self.kv_transfer,
            num_speculative_tokens=(self.speculative_config.num_speculative_tokens
                                    if isinstance(self.speculative_config, SpeculativeConfig)
                                    else 0),
        )

    @property
    def kv_transfer(self) -> KVTransferConfig | None:
        """The parsed ``kv_transfer_config``."""
        assert not isinstance(self.kv_transfer_config, (dict, str))  # parsed in __post_init__
        return self.kv_transfer_config


def parse_memory(text: str | int) -> int:
    """'4GiB', '512MB', '1e9' or an int -> bytes (``--kv-cache-memory``)."""
    if isinstance(text, int):
        return text
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9,
             "k": 2**10, "m": 2**20, "g": 2**30, "b": 1}
    s = text.strip().lower()
    unit = next((u for u in units if s.endswith(u)), "")
    number, scale = s[: len(s) - len(unit)].strip(), units.get(unit, 1)
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a memory size (e.g. 4GiB, 512MiB)") from None
    if value <= 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(value)
