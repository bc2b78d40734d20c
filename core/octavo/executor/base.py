"""``Executor``: how the engine core reaches its workers, wherever they run.

The core asks the same four things of every executor: run a method on every worker
(``collective_rpc``), run one step (``execute_model``: the scheduler output to every
worker, the output rank's answer back), say whether the workers are alive
(``check_health``) and stop them (``shutdown``). ``uni`` holds its one worker in the
core's process; ``mp`` runs a process per rank (``octavo.executor.multiproc``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from octavo.config import EngineConfig
from octavo.distributed.state import output_rank
from octavo.executor.messages import CallCodec, CallKind, ReplyCodec, RpcCall, WorkerReply
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform


class WorkerDiedError(RuntimeError):
    """A worker process is gone (or its answer can no longer come): the engine cannot
    run another step, unlike a step that failed and was answered with the error."""


class WorkerCallError(RuntimeError):
    """A worker raised while running a call; the message holds its error. The engine's
    step error: the step's requests fail, the workers keep serving."""


class Executor(ABC):
    def __init__(self, config: EngineConfig, platform: type[Platform],
                 files: ModelFiles) -> None:
        """Start the workers and load the model in each (``files`` were loaded in the
        core process: ``uni`` uses them, worker processes load their own)."""
        self.config = config
        self.platform = platform

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """``worker.<method>(*args)`` on every worker; their results in rank order."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step on every worker; the output rank's result."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise ``WorkerDiedError`` when a worker is gone."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and release what they share; safe to call twice."""

    def determine_num_blocks(self) -> int:
        """KV blocks every worker can hold (each holds its shard of every block)."""
        return min(self.collective_rpc("determine_num_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", (num_blocks,))


class RankedExecutor(Executor):
    """What the executors with one worker per rank outside this process (``mp``, ``ray``)
    share: the ranks, the output rank, the failure state, the codecs of their calls, and
    the two calls built on ``_call`` (every rank's ``WorkerReply``, in rank order)."""

    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(config, platform, files)
        self.world_size = config.parallel.world_size
        self.output_rank = output_rank(config.parallel.tensor_parallel_size,
                                       config.parallel.pipeline_parallel_size)
        self.on_failure = on_failure  # run (on a monitor thread) when a worker dies unasked
        self.failure: str | None = None  # why the executor is dead
        self._stopping = False
        self._call_codec, self._reply_codec = CallCodec(), ReplyCodec()

    @abstractmethod
    def _call(self, kind: CallKind, payload: Any) -> list[WorkerReply]:
        """Send a call to every worker and return every answer; the first error raises
        ``WorkerCallError`` once all are in."""

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        replies = self._call(CallKind.RPC, RpcCall(method, list(args)))
        return [reply.result for reply in replies]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = self._call(CallKind.EXECUTE, scheduler_output)[self.output_rank].output
        assert output is not None, "the output rank answered a step without its output"
        return output
