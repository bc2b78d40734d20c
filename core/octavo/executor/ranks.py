"""What the executors with one worker per rank outside the core's process (``mp``: a process
per rank; ``ray``: an actor per rank) share: the executor's half (``RankedExecutor``: ranks,
output rank, failure state, call codecs, the folding of every rank's reply) and the rank's
half (``start_rank``: join torch.distributed and load the model; ``run_call``: answer one
call). Each executor brings only its transport - shared-memory queues and pipes, or Ray's
object store and actor handles.
"""

from __future__ import annotations

import logging
import traceback
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from octavo.config import EngineConfig
from octavo.distributed.engine_group import ExpertGroupBroken, join_expert_group
from octavo.distributed.state import (
    RankInfo,
    get_parallel_state,
    init_distributed,
    output_rank,
)
from octavo.executor.base import Executor, WorkerCallError, WorkerDiedError
from octavo.executor.messages import CallCodec, CallKind, ReplyCodec, RpcCall, WorkerReply
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform
from octavo.worker.interface import WorkerInterface

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # loading a large model in every worker takes a while
STOP_TIMEOUT_S = 5.0  # after SHUTDOWN, before a worker is killed
# How long a collective may wait for a peer before torch.distributed gives up: a rank stuck
# that long is broken, and the engine is better told so than left hanging.
DIST_TIMEOUT_S = 600.0


class RankedExecutor(Executor):
    """The executor's half: ``_call`` (the transport) sends one call to every rank and
    returns their encoded replies in rank order; the rest is here, the same for both."""

    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(config, platform, files)
        self.world_size = config.parallel.world_size
        self.output_rank = output_rank(config.parallel.tensor_parallel_size,
                                       config.parallel.pipeline_parallel_size,
                                       config.parallel.sequence_parallel_size)
        self.on_failure = on_failure  # run (on a monitor thread) when a worker dies unasked
        self.failure: str | None = None  # why the executor is dead
        self._stopping = False
        self._call_codec, self._reply_codec = CallCodec(), ReplyCodec()

    @abstractmethod
    def _send(self, message: bytes) -> list[bytes]:
        """Send one encoded call to every rank; every rank's encoded reply, in rank order.
        A transport that finds a worker gone raises ``WorkerDiedError``."""

    def _call(self, kind: CallKind, payload: Any = None) -> list[WorkerReply]:
        """Send a call to every worker and wait for every answer; the first error (in rank
        order) raises ``WorkerCallError`` once all answers are in, so that every rank has
        finished the call and the transports stay in step."""
        self.check_health()
        return self._fold(self._send(self._call_codec.encode(kind, payload)))

    def _fold(self, encoded: list[bytes]) -> list[WorkerReply]:
        """Every rank's decoded reply; the first error (in rank order) raises
        ``WorkerCallError``."""
        replies = [self._reply_codec.decode(reply) for reply in encoded]
        errors = [reply.error for reply in replies if reply.error is not None]
        if errors:
            raise WorkerCallError(errors[0])
        return replies

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        replies = self._call(CallKind.RPC, RpcCall(method, list(args)))
        return [reply.result for reply in replies]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._step_output(self._call(CallKind.EXECUTE, scheduler_output))

    def _step_output(self, replies: list[WorkerReply]) -> ModelRunnerOutput:
        output = replies[self.output_rank].output
        assert output is not None, "the output rank answered a step without its output"
        return output

    def check_health(self) -> None:
        """``WorkerDiedError`` once a worker died or the executor was shut down."""
        if self.failure is not None:
            raise WorkerDiedError(self.failure)
        if self._stopping:
            raise WorkerDiedError("the workers were shut down")


def start_rank(config: EngineConfig, rank: int, platform_name: str, init_method: str,
               node_index: tuple[int, int], same_node: bool = True,
               ) -> tuple[WorkerInterface, RankInfo]:
    """The rank's half of the start: resolve the platform, bind its cores (``node_index``:
    this rank among the engine's ranks on its machine, and their number), join the
    engine's torch.distributed group (the platform's own tensor collectives only when
    every rank is on one node), then load this rank's shards of the model."""
    from octavo.executor.worker_factory import make_worker
    from octavo.models.loader import load_model_files
    from octavo.plugins import get_registries
    from octavo.plugins.resolve import resolve_platform

    parallel = config.parallel
    info = RankInfo.of(rank, parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                       parallel.sequence_parallel_size)
    platform = resolve_platform(platform_name, get_registries().platforms)
    platform.init_worker_process(*node_index)
    init_distributed(info, platform.dist_backend, init_method, DIST_TIMEOUT_S,
                     tensor_communicator=platform.tensor_communicator if same_node else None,
                     enable_expert_parallel=parallel.enable_expert_parallel)
    if parallel.experts_across_engines:
        assert parallel.data_parallel_master_port is not None, "set by the launch"
        rank_in_group = parallel.expert_group_rank + info.tp_rank
        get_parallel_state().ep = join_expert_group(
            parallel.data_parallel_address, parallel.data_parallel_master_port,
            rank_in_group, parallel.data_parallel_size * parallel.tensor_parallel_size,
            platform.dist_backend, DIST_TIMEOUT_S)
    return make_worker(config, platform, load_model_files(config.model.model)), info


class StepLeftRanksApart(RuntimeError):
    """A step raised on one rank of several: its peers wait in a collective it never
    joins (an all-reduce, a pipeline receive, an expert exchange), and the shared-memory
    all-reduce's call count would differ between ranks from then on. The rank ends, as a
    dead worker does: the executor stops the others and the engine fails at once
    (``--restart-engine`` starts a new one) instead of hanging for a collective's timeout
    and then mixing the data of different calls."""


def run_call(worker: WorkerInterface, info: RankInfo, kind: CallKind,
             payload: Any) -> WorkerReply:
    """Run one call on the worker and make its answer: the step's output (an empty one on
    every rank but the output rank), the RPC's result, or the text of the error it raised.
    A broken expert group, or a step that raised where the rank has peers, is not
    answered: it propagates and ends the worker."""
    try:
        if kind is CallKind.EXECUTE:
            output = worker.execute_model(payload)
            return WorkerReply(output=output if info.is_output_rank else
                               ModelRunnerOutput(req_ids=[], sampled_token_ids=[]))
        assert isinstance(payload, RpcCall)
        return WorkerReply(result=getattr(worker, payload.method)(*payload.args))
    except ExpertGroupBroken:
        raise
    except Exception as exc:
        if kind is CallKind.EXECUTE and (info.world_size > 1
                                         or get_parallel_state().ep is not None):
            raise StepLeftRanksApart(f"rank {info.rank}: a step raised "
                                     f"{type(exc).__name__}: {exc}") from exc
        logger.exception("worker rank %d: %s failed", info.rank, kind.name)
        return WorkerReply(error=f"rank {info.rank}: {type(exc).__name__}: {exc}\n"
                                 f"{traceback.format_exc()}")
