"""``ParallelConfig``: how a model is spread over devices and engines (vLLM's names).

The fields are the ones the executor and data-parallel work fills in; until those land,
any size above 1 is refused here with a message that says what exists today.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints

EXECUTOR_BACKENDS = ("uni", "mp", "ray")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "Tensor-parallel workers (planned: only 1 runs today).", "alias": "-tp"})
    pipeline_parallel_size: int = field(default=1, metadata={
        "help": "Pipeline stages (planned: only 1 runs today).", "alias": "-pp"})
    data_parallel_size: int = field(default=1, metadata={
        "help": "Engine cores behind one server (planned: only 1 runs today).", "alias": "-dp"})
    enable_expert_parallel: bool = field(default=False, metadata={
        "help": "Shard MoE experts over the tensor-parallel workers instead of slicing "
                "each expert (planned)."})
    distributed_executor_backend: str | None = field(default=None, metadata={
        "help": "How workers run: uni (in the engine process), mp (a process per worker) "
                "or ray; default: uni for one worker. Only uni exists today.",
        "choices": EXECUTOR_BACKENDS})

    def __post_init__(self) -> None:
        check_positive_ints("", tensor_parallel_size=self.tensor_parallel_size,
                            pipeline_parallel_size=self.pipeline_parallel_size,
                            data_parallel_size=self.data_parallel_size)
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ConfigError(f"distributed_executor_backend must be one of "
                              f"{', '.join(EXECUTOR_BACKENDS)}; got {backend!r}")
        self._refuse_what_is_not_built()

    @property
    def world_size(self) -> int:
        """Workers of one engine: tensor x pipeline."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _refuse_what_is_not_built(self) -> None:
        planned = {"tensor_parallel_size": self.tensor_parallel_size,
                   "pipeline_parallel_size": self.pipeline_parallel_size,
                   "data_parallel_size": self.data_parallel_size}
        for name, size in planned.items():
            if size != 1:
                raise ConfigError(f"{name}={size}: parallelism is not available yet (no "
                                  f"multi-process executor); use {name}=1")
        if self.enable_expert_parallel:
            raise ConfigError("enable_expert_parallel: expert parallelism is not available "
                              "yet (it needs tensor_parallel_size > 1)")
        if self.distributed_executor_backend not in (None, "uni"):
            raise ConfigError(f"distributed_executor_backend="
                              f"{self.distributed_executor_backend!r} is not available yet; "
                              "only 'uni' (the worker in the engine process) exists")
