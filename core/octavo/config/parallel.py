"""``ParallelConfig``: how a model is spread over devices and engines (vLLM's names).

Tensor and pipeline parallelism run on the ``mp`` executor (a worker process per rank);
data parallelism and the ``ray`` executor belong to the multi-node work and are refused
here with a message that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints

EXECUTOR_BACKENDS = ("uni", "mp", "ray")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "Tensor-parallel workers: each holds a slice of every layer.", "alias": "-tp"})
    pipeline_parallel_size: int = field(default=1, metadata={
        "help": "Pipeline stages: each worker holds a run of consecutive layers.",
        "alias": "-pp"})
    data_parallel_size: int = field(default=1, metadata={
        "help": "Engine cores behind one server (planned: only 1 runs today).", "alias": "-dp"})
    enable_expert_parallel: bool = field(default=False, metadata={
        "help": "Shard MoE experts over the tensor-parallel workers (whole experts per "
                "worker) instead of slicing each expert."})
    distributed_executor_backend: str | None = field(default=None, metadata={
        "help": "How workers run: uni (in the engine process; one worker only) or mp (a "
                "process per worker); default: uni for one worker, mp for more. ray is "
                "planned.",
        "choices": EXECUTOR_BACKENDS})

    def __post_init__(self) -> None:
        check_positive_ints("", tensor_parallel_size=self.tensor_parallel_size,
                            pipeline_parallel_size=self.pipeline_parallel_size,
                            data_parallel_size=self.data_parallel_size)
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ConfigError(f"distributed_executor_backend must be one of "
                              f"{', '.join(EXECUTOR_BACKENDS)}; got {backend!r}")
        if backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
        self._refuse_what_is_not_built()

    @property
    def world_size(self) -> int:
        """Workers of one engine: tensor x pipeline."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _refuse_what_is_not_built(self) -> None:
        if self.data_parallel_size != 1:
            raise ConfigError(f"data_parallel_size={self.data_parallel_size}: data "
                              "parallelism is not available yet; use data_parallel_size=1")
        if self.distributed_executor_backend == "ray":
            raise ConfigError("distributed_executor_backend='ray' is not available yet; "
                              "use 'mp' (a process per worker on this machine)")
        if self.distributed_executor_backend == "uni" and self.world_size > 1:
            raise ConfigError(f"distributed_executor_backend='uni' runs one worker, but "
                              f"tensor_parallel_size x pipeline_parallel_size = "
                              f"{self.world_size}; use 'mp'")
        if self.enable_expert_parallel and self.tensor_parallel_size == 1:
            raise ConfigError("enable_expert_parallel shards experts over the "
                              "tensor-parallel workers: it needs tensor_parallel_size > 1")
