"""``ParallelConfig``: how a model is spread over devices and engines (vLLM's names).

Tensor and pipeline parallelism split one engine's model over workers (``mp``: a process
per rank on this machine; ``ray``: an actor per rank on a Ray cluster). Data parallelism
runs several engines, each with its own workers, behind one API server; a headless node
(``octavo serve --headless``) runs some of them for a front end on another node.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints

EXECUTOR_BACKENDS = ("uni", "mp", "ray")
DATA_PARALLEL_BACKENDS = ("mp", "ray")
RAY_MISSING = "Ray is not installed: pip install 'octavo[ray]'"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "Tensor-parallel workers: each holds a slice of every layer.", "alias": "-tp"})
    pipeline_parallel_size: int = field(default=1, metadata={
        "help": "Pipeline stages: each worker holds a run of consecutive layers.",
        "alias": "-pp"})
    sequence_parallel_size: int = field(default=1, metadata={
        "help": "Ulysses sequence-parallel workers (per tensor rank): each runs a slice of "
                "every step's tokens, and attention over all of them for a slice of the "
                "heads.", "alias": "-sp"})
    # None until EngineConfig settles it: on where it runs (vLLM always runs them).
    enable_pipeline_micro_batching: bool | None = field(default=None, metadata={
        "help": "With pipeline stages (mp executor), keep one step in flight per stage, "
                "so that every stage computes at once (vLLM always does). Default: on with "
                "pipeline stages on the mp executor, off with speculative decoding, a KV "
                "connector or a --scheduler-cls plugin; see docs/parallel.md, "
                "\"Micro-batches\"."})
    data_parallel_size: int = field(default=1, metadata={
        "help": "Engines behind one server, each with its own workers (replicas); requests "
                "go to the least loaded.", "alias": "-dp"})
    data_parallel_size_local: int | None = field(default=None, metadata={
        "help": "Engines on this node (default: all of them); the rest hand-shake from "
                "headless nodes."})
    data_parallel_start_rank: int = field(default=0, metadata={
        "help": "The data-parallel rank of this node's first engine (headless nodes)."})
    data_parallel_address: str = field(default="127.0.0.1", metadata={
        "help": "The front end's address: it binds its engine sockets there, and "
                "headless nodes connect to it."})
    data_parallel_rpc_port: int = field(default=29550, metadata={
        "help": "The front end's port for headless engines' handshakes."})
    data_parallel_backend: str = field(default="mp", metadata={
        "help": "How the engines run: mp (processes on this node) or ray (Ray actors).",
        "choices": DATA_PARALLEL_BACKENDS})
    # This engine's rank among the data-parallel engines: set per engine, not a flag
    # (None: the node's first, data_parallel_start_rank).
    data_parallel_rank: int | None = None
    data_parallel_master_port: int | None = field(default=None, metadata={
        "help": "With data_parallel_size > 1 and enable_expert_parallel: the port on "
                "data_parallel_address where engine 0 serves the rendezvous of the "
                "engines' expert group (default: a free port, when every engine runs on "
                "this node; headless nodes must be given the same one)."})
    enable_expert_parallel: bool = field(default=False, metadata={
        "help": "Shard MoE experts as whole experts: over the tensor-parallel workers, or "
                "with data_parallel_size > 1 over every worker of every engine (tokens "
                "travel to their experts by all-to-all)."})
    distributed_executor_backend: str | None = field(default=None, metadata={
        "help": "How one engine's workers run: uni (in the engine process; one worker "
                "only), mp (a process per worker) or ray (an actor per worker on a Ray "
                "cluster); default: uni for one worker, mp for more.",
        "choices": EXECUTOR_BACKENDS})

    def __post_init__(self) -> None:
        check_positive_ints("", tensor_parallel_size=self.tensor_parallel_size,
                            pipeline_parallel_size=self.pipeline_parallel_size,
                            sequence_parallel_size=self.sequence_parallel_size,
                            data_parallel_size=self.data_parallel_size,
                            data_parallel_rpc_port=self.data_parallel_rpc_port)
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ConfigError(f"distributed_executor_backend must be one of "
                              f"{', '.join(EXECUTOR_BACKENDS)}; got {backend!r}")
        if self.data_parallel_backend not in DATA_PARALLEL_BACKENDS:
            raise ConfigError(f"data_parallel_backend must be one of "
                              f"{', '.join(DATA_PARALLEL_BACKENDS)}; got "
                              f"{self.data_parallel_backend!r}")
        if backend is None:
            # Across engines the expert group's worker needs a process of its own.
            one = self.world_size == 1 and not self.experts_across_engines
            self.distributed_executor_backend = "uni" if one else "mp"
        if self.data_parallel_size_local is None:
            self.data_parallel_size_local = self.data_parallel_size - self.data_parallel_start_rank
        if self.data_parallel_rank is None:
            self.data_parallel_rank = self.data_parallel_start_rank
        self._check_data_parallel_ranks()
        self._refuse_what_is_not_built()

    @property
    def world_size(self) -> int:
        """Workers of one engine: tensor x sequence x pipeline."""
        return (self.tensor_parallel_size * self.sequence_parallel_size
                * self.pipeline_parallel_size)

    @property
    def engine_index(self) -> int:
        """This engine's data-parallel rank: ``data_parallel_rank`` as ``__post_init__``
        resolved it (the node's first engine where it was None)."""
        assert self.data_parallel_rank is not None, "set by __post_init__"
        return self.data_parallel_rank

    @property
    def data_parallel_rank_local(self) -> int:
        """This engine's index among the engines of its node (its share of the cores)."""
        return self.engine_index - self.data_parallel_start_rank

    def node_worker_index(self, rank: int) -> tuple[int, int]:
        """Worker ``rank`` of this engine as (index, count) among the workers of all the
        engines on this node: what its cores and its device are chosen by."""
        assert self.data_parallel_size_local is not None
        return (self.data_parallel_rank_local * self.world_size + rank,
                self.data_parallel_size_local * self.world_size)

    @property
    def uses_ray(self) -> bool:
        return "ray" in (self.distributed_executor_backend, self.data_parallel_backend)

    def _check_data_parallel_ranks(self) -> None:
        local, start, size = (self.data_parallel_size_local, self.data_parallel_start_rank,
                              self.data_parallel_size)
        assert local is not None and self.data_parallel_rank is not None
        if local < 0 or start < 0 or start + local > size:
            raise ConfigError(f"data_parallel_start_rank={start} and "
                              f"data_parallel_size_local={local} name engines beyond "
                              f"data_parallel_size={size}")
        if not start <= self.data_parallel_rank < max(start + local, 1):
            raise ConfigError(f"data_parallel_rank={self.data_parallel_rank} is not one of "
                              f"this node's engines ({start} to {start + local - 1})")

    def _refuse_what_is_not_built(self) -> None:
        if self.uses_ray and importlib.util.find_spec("ray") is None:
            raise ConfigError(f"the 'ray' backend needs Ray. {RAY_MISSING}")
        if self.distributed_executor_backend == "uni" and self.world_size > 1:
            raise ConfigError(f"distributed_executor_backend='uni' runs one worker, but "
                              f"tensor_parallel_size x sequence_parallel_size x "
                              f"pipeline_parallel_size = {self.world_size}; use 'mp'")
        if (self.enable_expert_parallel and self.tensor_parallel_size == 1
                and self.data_parallel_size == 1):
            raise ConfigError("enable_expert_parallel shards experts over the "
                              "tensor-parallel workers: it needs tensor_parallel_size > 1")
        if self.sequence_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ConfigError(f"sequence_parallel_size={self.sequence_parallel_size} with "
                              f"pipeline_parallel_size={self.pipeline_parallel_size} is not "
                              "built: a stage would hand the next a slice of the sequence; "
                              "use one of them")
        if self.experts_across_engines:
            self._refuse_with_experts_across_engines()

    def _refuse_with_experts_across_engines(self) -> None:
        """What expert parallelism over data-parallel engines does not run with (yet)."""
        unbuilt = [(f"pipeline_parallel_size={self.pipeline_parallel_size}",
                    self.pipeline_parallel_size > 1),
                   (f"sequence_parallel_size={self.sequence_parallel_size}",
                    self.sequence_parallel_size > 1),
                   ("data_parallel_backend='ray'", self.data_parallel_backend == "ray"),
                   (f"distributed_executor_backend={self.distributed_executor_backend!r} "
                    "(the expert group's workers are mp processes)",
                    self.distributed_executor_backend != "mp")]
        for what, used in unbuilt:
            if used:
                raise ConfigError(f"enable_expert_parallel with data_parallel_size="
                                  f"{self.data_parallel_size} does not run with {what} yet")

    @property
    def experts_across_engines(self) -> bool:
        """Expert parallelism over every worker of every data-parallel engine."""
        return self.enable_expert_parallel and self.data_parallel_size > 1

    @property
    def expert_group_rank(self) -> int:
        """Where tensor rank 0 of this engine sits in the expert group."""
        return self.engine_index * self.tensor_parallel_size
