"""``RayWorker``: one rank of the ``ray`` executor, as a Ray actor.

It starts as a worker process of ``mp`` does (``ranks.start_rank``): its platform, its cores, the
engine's torch.distributed group, the model, loaded from files on its own node. It is told
where to rendezvous by the executor, which first asks rank 0 for its node's address and a
port free there. Calls arrive encoded as ``mp``'s do (``octavo.executor.messages``: msgspec,
not pickle) and are answered by the same code (``ranks.run_call``), so an RPC's error on a
rank comes back as that call's answer, and the actor serves on; a step that raised where
the rank has peers ends the actor (``ranks.StepLeftRanksApart``).

The actor's calls run one at a time, in order; ``wait_forever`` runs beside them (a
concurrency group of its own), and its result never comes: the executor's monitor waits on
it, and Ray fails it when the actor dies, however it died. Ray owns the process: it ends
when the executor kills the actor, or with the engine's Ray job (the driver's actors share
its fate), so no worker outlives its engine.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from dataclasses import dataclass

import ray

from octavo.config import EngineConfig
from octavo.distributed.engine_group import ExpertGroupBroken
from octavo.distributed.state import RankInfo
from octavo.executor.messages import CallCodec, ReplyCodec
from octavo.executor.ranks import StepLeftRanksApart, run_call, start_rank
from octavo.net import free_port
from octavo.worker.interface import WorkerInterface

logger = logging.getLogger(__name__)


@dataclass
class RayWorkerInit:
    """What a rank needs to start, besides its rank (the actor's constructor argument)."""

    config: EngineConfig
    platform: str  # the platform the engine resolved: every rank runs the same one
    init_method: str  # tcp://<rank 0's node address>:<a port free there>
    # This rank among the engine's ranks on its machine: its share of the machine's cores.
    local_rank: int
    local_world_size: int
    # Every rank on one Ray node: the platform's own tensor collectives (shared memory on
    # the CPU) can join them; across nodes the process group's (gloo, NCCL) must.
    same_node: bool


@ray.remote(concurrency_groups={"monitor": 1})  # type: ignore[call-overload]
class RayWorker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._calls, self._replies = CallCodec(), ReplyCodec()
        self._worker: WorkerInterface | None = None
        self._info = RankInfo()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a TCP port free on it now (asked of rank 0)."""
        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def start(self, init: RayWorkerInit) -> str | None:
        """Join the process group and load the model; None once ready, else the error's
        text (the executor fails the engine with it; this actor is then killed)."""
        try:
            self._start(init)
        except Exception as exc:
            logger.critical("worker rank %d failed to start:\n%s", self.rank,
                            traceback.format_exc())
            return f"worker rank {self.rank} failed to start: {type(exc).__name__}: {exc}"
        logger.info("worker rank %d ready (pid %d)", self.rank, os.getpid())
        return None

    def _start(self, init: RayWorkerInit) -> None:
        self._worker, self._info = start_rank(
            init.config, self.rank, init.platform, init.init_method,
            (init.local_rank, init.local_world_size), same_node=init.same_node)

    def call(self, message: bytes) -> bytes:
        """One encoded call (a step or an RPC) -> its encoded ``WorkerReply``."""
        assert self._worker is not None, "a call before the worker started"
        kind, payload = self._calls.decode(message)
        try:
            return self._replies.encode(run_call(self._worker, self._info, kind, payload))
        except (ExpertGroupBroken, StepLeftRanksApart):  # as a worker process does: the
            # actor ends, and with it the engine (its sentinel fails)
            logger.critical("worker rank %d failed:\n%s", self.rank, traceback.format_exc())
            os._exit(1)

    @ray.method(concurrency_group="monitor")
    def wait_forever(self) -> None:
        """Never returns: its result fails when the actor dies."""
        threading.Event().wait()
