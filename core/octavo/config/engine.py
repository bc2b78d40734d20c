"""``EngineConfig``: every part of an engine's configuration, composed.

``EngineConfig.from_kwargs`` takes the flat keywords a vLLM user passes to ``LLM(...)``;
each keyword is the name of one field of one part (``max_num_seqs`` is
``SchedulerConfig.max_num_seqs``), and the CLI's engine flags are generated from the same
fields (:func:`flat_fields`), so every default is written once, in its part.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from octavo.config.cache import CacheConfig
from octavo.config.compilation import CompilationConfig, check_compilation_combinations
from octavo.config.device import DeviceConfig
from octavo.config.errors import ConfigError
from octavo.config.kv_transfer import KVTransferConfig
from octavo.config.lora import LoRAConfig
from octavo.config.model import ModelConfig
from octavo.config.observability import ObservabilityConfig
from octavo.config.parallel import ParallelConfig
from octavo.config.parse import check_known_keys, parse_json_object
from octavo.config.pooler import PoolerConfig
from octavo.config.scheduler import SchedulerConfig
from octavo.config.speculative import SpeculativeConfig
from octavo.config.structured_outputs import StructuredOutputsConfig

# The parts whose fields are flat keywords, by EngineConfig attribute.
PARTS: dict[str, type] = {"model": ModelConfig, "cache": CacheConfig,
                          "scheduler": SchedulerConfig, "parallel": ParallelConfig,
                          "device": DeviceConfig, "observability": ObservabilityConfig,
                          "lora": LoRAConfig}
# Parts given as one JSON object each, by their keyword (vLLM's names).
JSON_PARTS = {"speculative_config": "speculative", "kv_transfer_config": "kv_transfer",
              "structured_outputs_config": "structured_outputs", "pooler_config": "pooler",
              "compilation_config": "compilation"}


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    kv_transfer: KVTransferConfig | None = None  # None: no KV connector
    # The pooling runner's settings; what a key leaves out is the model's (see PoolerConfig).
    pooler: PoolerConfig = field(default_factory=PoolerConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)  # -O

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat vLLM-style keywords (``LLM(model=..., max_num_seqs=...)``); the
        JSON parts (``speculative_config``, ...) take JSON text or a dict."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
        owners = {f.name: part for part, f in flat_fields()}
        json_parts: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in JSON_PARTS:
                json_parts[JSON_PARTS[key]] = value
            elif key in owners:
                parts[owners[key]][key] = value
            else:
                raise ConfigError(f"unknown engine argument {key!r}")
        built = {name: PARTS[name](**values) for name, values in parts.items()}
        return cls(**built,
                   speculative=SpeculativeConfig.parse(json_parts.get("speculative")),
                   kv_transfer=KVTransferConfig.parse(json_parts.get("kv_transfer")),
                   structured_outputs=_structured(json_parts.get("structured_outputs")),
                   pooler=PoolerConfig.parse(json_parts.get("pooler")),
                   compilation=CompilationConfig.parse(json_parts.get("compilation")))

    def __post_init__(self) -> None:
        check_parallel_combinations(self)
        check_compilation_combinations(self.compilation, enforce_eager=self.device.enforce_eager,
                                       world_size=self.parallel.world_size,
                                       enable_lora=self.lora.enable_lora)
        if self.model.runner == "pooling":
            check_pooling_combinations(self)
        if self.lora.enable_lora:
            check_lora_combinations(self)
        resolve_pipeline_micro_batching(self)
        resolve_async_scheduling(self)
        if self.model.enable_prompt_embeds and self.speculative is not None:
            # vLLM refuses it too: drafts are proposed from token ids a prompt of
            # embeddings does not have.
            raise ConfigError("enable_prompt_embeds does not run with speculative decoding "
                              "(speculative_config); turn one of them off")

    def for_data_parallel_rank(self, rank: int) -> EngineConfig:
        """The config of data-parallel engine ``rank`` (each engine knows its rank)."""
        return replace(self, parallel=replace(self.parallel, data_parallel_rank=rank))

    @property
    def num_speculative_tokens(self) -> int:
        """k of speculative decoding; 0 when it is off."""
        return self.speculative.num_speculative_tokens if self.speculative else 0


def check_parallel_combinations(config: EngineConfig) -> None:
    """Refuse, at start, the features that do not run with several workers yet, naming
    them: a combination that is not refused is tested (tests/parallel)."""
    parallel = config.parallel
    if parallel.experts_across_engines and (config.speculative or config.kv_transfer):
        # A drafter's or a connector's extra forward passes would step one engine's MoE
        # collectives without the others.
        raise ConfigError("enable_expert_parallel with data_parallel_size > 1 does not run "
                          "with speculative decoding or a KV connector yet")
    if parallel.world_size == 1:
        return
    sizes = (f"tensor_parallel_size={parallel.tensor_parallel_size}, "
             f"sequence_parallel_size={parallel.sequence_parallel_size}, "
             f"pipeline_parallel_size={parallel.pipeline_parallel_size}")
    # With n-gram drafts at TP=2 a run was seen to differ from the same run without them
    # (seed 653238017 of tests/parallel), which one rank never does: refused until found.
    if config.speculative is not None:
        raise ConfigError(f"speculative decoding does not run with several workers yet "
                          f"({sizes}); use one worker")
    # A connector stores each rank's shard under its tensor and pipeline coordinates: the
    # sequence ranks' different heads would share names.
    if config.kv_transfer is not None and parallel.sequence_parallel_size > 1:
        raise ConfigError(f"a KV connector (kv_transfer_config) does not run with sequence "
                          f"parallelism yet ({sizes})")


def check_pooling_combinations(config: EngineConfig) -> None:
    """Refuse, at start, what the pooling runner does not run with (yet), naming it: a
    pooling request computes its prompt once and samples nothing, so drafts, KV transfers
    and generation settings have no place; several workers or engines are untested."""
    unsupported = [
        ("speculative decoding (speculative_config)", config.speculative is not None),
        ("a KV connector (kv_transfer_config)", config.kv_transfer is not None),
        ("prompt embeddings (enable_prompt_embeds)", config.model.enable_prompt_embeds),
        (f"tensor_parallel_size={config.parallel.tensor_parallel_size}",
         config.parallel.tensor_parallel_size > 1),
        (f"pipeline_parallel_size={config.parallel.pipeline_parallel_size}",
         config.parallel.pipeline_parallel_size > 1),
        (f"sequence_parallel_size={config.parallel.sequence_parallel_size}",
         config.parallel.sequence_parallel_size > 1),
        (f"data_parallel_size={config.parallel.data_parallel_size}",
         config.parallel.data_parallel_size > 1),
        (f"scheduler_cls={config.scheduler.scheduler_cls}",
         config.scheduler.scheduler_cls != "default"),
    ]
    for what, used in unsupported:
        if used:
            raise ConfigError(f"the pooling runner (runner=pooling) does not run with {what} "
                              "yet")


def check_lora_combinations(config: EngineConfig) -> None:
    """Refuse, at start, what LoRA does not run with (yet), naming it."""
    unsupported = [
        ("the pooling runner (runner=pooling)", config.model.runner == "pooling"),
        ("speculative decoding (speculative_config)", config.speculative is not None),
        (f"sequence_parallel_size={config.parallel.sequence_parallel_size}",
         config.parallel.sequence_parallel_size > 1),
    ]
    for what, used in unsupported:
        if used:
            raise ConfigError(f"LoRA (enable_lora) does not run with {what} yet")


def async_scheduling_refusals(config: EngineConfig) -> list[str]:
    """What in ``config`` async scheduling does not run with (yet), each named: pipeline
    stages keep their own steps in flight (micro-batches); a KV connector plans its loads
    and saves step by step; a pooling request samples nothing to overlap; the other
    layouts are untested with it; a ``--scheduler-cls`` plugin says only once built whether
    it keeps steps in flight (the engine core checks it when it is asked for)."""
    parallel = config.parallel
    unsupported = [
        (f"pipeline_parallel_size={parallel.pipeline_parallel_size} (its steps in flight "
         "are micro-batches: enable_pipeline_micro_batching)",
         parallel.pipeline_parallel_size > 1),
        (f"sequence_parallel_size={parallel.sequence_parallel_size}",
         parallel.sequence_parallel_size > 1),
        (f"data_parallel_size={parallel.data_parallel_size}", parallel.data_parallel_size > 1),
        ("distributed_executor_backend='ray'", parallel.distributed_executor_backend == "ray"),
        ("a KV connector (kv_transfer_config)", config.kv_transfer is not None),
        ("the pooling runner (runner=pooling)", config.model.runner == "pooling"),
    ]
    return [what for what, used in unsupported if used]


def resolve_pipeline_micro_batching(config: EngineConfig) -> None:
    """Settle ``enable_pipeline_micro_batching`` once: unset (None) it is on with pipeline
    stages on the ``mp`` executor (vLLM's batch queue; W1 at PP=2 1.59-1.62x without, on the
    idle 2-core guest) and off where steps run one at a time anyway (one stage, ``ray``) or
    must (drafts are proposed from the step before, a KV connector plans step by step, a
    ``--scheduler-cls`` plugin says only once built whether it keeps steps in flight); asked
    for with those, the engine core refuses the start, naming why."""
    parallel = config.parallel
    if parallel.enable_pipeline_micro_batching is not None:
        return
    parallel.enable_pipeline_micro_batching = (
        parallel.pipeline_parallel_size > 1 and parallel.distributed_executor_backend == "mp"
        and config.speculative is None and config.kv_transfer is None
        and config.scheduler.scheduler_cls == "default")


def resolve_async_scheduling(config: EngineConfig) -> None:
    """Settle ``async_scheduling`` once, as vLLM does: unset (None) it is on wherever it
    runs - the default scheduler and none of :func:`async_scheduling_refusals` - and off
    elsewhere; asked for (True) where it does not run, the start is refused, naming why."""
    scheduler = config.scheduler
    refusals = async_scheduling_refusals(config)
    if scheduler.async_scheduling is None:
        scheduler.async_scheduling_by_default = True
        scheduler.async_scheduling = not refusals and scheduler.scheduler_cls == "default"
    elif scheduler.async_scheduling and refusals:
        raise ConfigError(f"async scheduling (async_scheduling) does not run with "
                          f"{refusals[0]} yet")


def flat_fields() -> list[tuple[str, Field[Any]]]:
    """(part, field) of every flat keyword, in CLI order; fields without help text are
    keyword-only settings with no flag (``log_stats_interval``)."""
    return [(part, f) for part, cls in PARTS.items() for f in fields(cls) if f.init]


def _structured(value: str | dict[str, Any] | None) -> StructuredOutputsConfig:
    if value is None:
        return StructuredOutputsConfig()
    keys = parse_json_object(value, "structured_outputs_config")
    check_known_keys(keys, StructuredOutputsConfig, "structured_outputs_config")
    return StructuredOutputsConfig(**keys)
