"""``RayExecutor`` (``ray``): one worker actor per rank on a running Ray cluster.

Behaves as ``MultiprocExecutor`` does, with Ray in place of the processes and queues. At
start it joins the cluster (``ray_placement.connect``), reserves one bundle per rank (a CPU,
or a GPU, each) in a placement group, and starts one ``RayWorker`` actor in each bundle.
Rank 0 names the rendezvous (its node's address, a port free there); every rank joins
torch.distributed with the platform's backend, the platform's own tensor collectives
(shared memory on the CPU) only when every rank is on one Ray node.

Each call is encoded once (msgspec, as ``mp``'s), put once into Ray's object store and read
by every actor; each actor answers with its encoded ``WorkerReply``, and the output rank's
answer is the step's result. An error on a rank fails the call once every rank has
answered; an actor that dies fails it at once (``WorkerDiedError``).

A monitor thread waits on every actor's ``wait_forever``, whose result Ray fails when the
actor dies: when one dies unasked, the executor kills the others (they would wait forever on
a collective with it), and ``on_failure`` runs. ``shutdown`` kills the actors, removes the
placement group and leaves the cluster if it joined it; the cluster itself is the user's.

Environment: the workers get the engine's ``OCTAVO_*`` settings (plugins, kernels, core
binding, logging; not the server's API key), and ``GLOO_SOCKET_IFNAME=lo`` when every node
is on a loopback address (one machine), where gloo would otherwise pick an interface of the
host's name.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from octavo.config import EngineConfig
from octavo.executor.base import WorkerCallError, WorkerDiedError
from octavo.executor.ranks import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, RankedExecutor
from octavo.executor.ray_placement import (
    NodePlacement,
    connect,
    in_bundle,
    placement_of,
    ray_resource,
    release,
    reserve,
)
from octavo.executor.ray_worker import RayWorker, RayWorkerInit
from octavo.models.loader import ModelFiles
from octavo.platforms import Platform

logger = logging.getLogger(__name__)

SECRET_ENV = frozenset({"OCTAVO_API_KEY"})  # the server's, not the workers'


class RayExecutor(RankedExecutor):
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(config, platform, files, on_failure)
        self.actors: list[Any] = []  # ray ActorHandles, in rank order
        self.placement: list[NodePlacement] = []  # each rank's node
        self._placement_group: Any = None
        self._sentinels: list[Any] = []  # each actor's wait_forever
        self._monitor: threading.Thread | None = None
        resource = ray_resource(platform)  # before joining: nothing to undo when refused
        self._joined_ray = connect()
        try:
            self._placement_group = reserve(resource, self.world_size)
            self.placement = placement_of(self._placement_group)
            self._start_workers(config, platform, resource)
        except BaseException as exc:
            self.failure = f"the workers did not start: {exc}"
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch_workers, name="executor-monitor",
                                         daemon=True)
        self._monitor.start()
        atexit.register(self.shutdown)  # an engine its owner never shuts down

    # -- start-up -----------------------------------------------------------------------
    def _start_workers(self, config: EngineConfig, platform: type[Platform],
                       resource: str) -> None:
        self._create_actors(resource)
        [(_, (ip, port))] = self._answers([self.actors[0].rendezvous.remote()],
                                          "the rendezvous", STARTUP_TIMEOUT_S)
        same_node = len({p.node_id for p in self.placement}) == 1
        starts = [actor.start.remote(RayWorkerInit(
            config=config, platform=platform.name, init_method=f"tcp://{ip}:{port}",
            local_rank=local_rank, local_world_size=local_size, same_node=same_node))
            for actor, (local_rank, local_size) in zip(self.actors,
                                                       local_ranks(self.placement))]
        # The first rank that fails fails the start at once: the ranks before it would
        # wait for it in torch.distributed until the rendezvous times out.
        for _, error in self._answers(starts, "the start", STARTUP_TIMEOUT_S):
            if error is not None:
                raise WorkerDiedError(error)
        logger.info("%d Ray workers ready on %d node(s): %s", self.world_size,
                    len({p.node_id for p in self.placement}),
                    ", ".join(f"rank {r} on {p.ip} ({p.node_id[:8]})"
                              for r, p in enumerate(self.placement)))

    def _create_actors(self, resource: str) -> None:
        """One actor per rank, in its rank's bundle, and the monitor's call on each."""
        env = worker_env(self.placement)
        amounts = {"num_cpus": 1} if resource == "CPU" else {"num_cpus": 0, "num_gpus": 1}
        for rank in range(self.world_size):
            self.actors.append(RayWorker.options(  # type: ignore[attr-defined]
                scheduling_strategy=in_bundle(self._placement_group, rank),
                runtime_env={"env_vars": env}, **amounts).remote(rank))
        self._sentinels = [actor.wait_forever.remote() for actor in self.actors]

    # -- calls --------------------------------------------------------------------------
    def _send(self, message: bytes) -> list[bytes]:
        """Put once into Ray's object store, read by every actor; a dead actor fails the
        call at once, whatever the other ranks still wait for."""
        ref = ray.put(message)
        answers = dict(self._answers([actor.call.remote(ref) for actor in self.actors],
                                     "the call"))
        return [answers[rank] for rank in range(self.world_size)]

    def _answers(self, refs: list[Any], what: str,
                 timeout_s: float | None = None) -> Iterator[tuple[int, Any]]:
        """``(rank, result)`` of each ref as it comes; a dead actor raises
        ``WorkerDiedError`` at once, whatever the other ranks still wait for."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise WorkerDiedError(f"{len(pending)} worker(s) did not answer {what} "
                                      f"within {timeout_s:.0f} s")
            rank = refs.index(ready[0])
            try:
                result = ray.get(ready[0])
            except RayTaskError as exc:  # the actor's own method failed (not the worker's)
                raise WorkerCallError(f"rank {rank}: {exc}") from None
            except RayError as exc:
                raise WorkerDiedError(self.failure or f"worker rank {rank} died: "
                                      f"{first_line(exc)}") from None
            yield rank, result

    # -- failure and shutdown -----------------------------------------------------------
    def _watch_workers(self) -> None:
        """Wait for any actor's death; unless the executor is stopping, that is the
        engine's failure: the other actors are killed and ``on_failure`` runs."""
        ready, _ = ray.wait(self._sentinels, num_returns=1, timeout=None)
        if self._stopping:
            return
        rank = self._sentinels.index(ready[0])
        try:
            ray.get(ready[0])
            reason = "its monitor call returned"  # wait_forever never does
        except RayError as exc:
            reason = first_line(exc)
        self.failure = (f"worker rank {rank} (Ray actor on node {self.placement[rank].ip} "
                        f"{self.placement[rank].node_id[:8]}) died: {reason}")
        logger.error("%s; stopping the other workers", self.failure)
        self._kill_actors()
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def _kill_actors(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.shutdown)
        self._kill_actors()
        if self._monitor is not None:
            self._monitor.join(STOP_TIMEOUT_S)  # it wakes as the actors die
        release(self._placement_group, self._joined_ray)


def worker_env(placement: list[NodePlacement]) -> dict[str, str]:
    """The environment variables the workers get on top of their node's (see above)."""
    env = {name: value for name, value in os.environ.items()
           if name.startswith("OCTAVO_") and name not in SECRET_ENV}
    if all(p.is_loopback for p in placement):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def local_ranks(placement: list[NodePlacement]) -> list[tuple[int, int]]:
    """Each rank's index among the ranks on its machine, and their number: the share of
    the machine's cores its threads take. A machine is an address, not a Ray node: two
    raylets started on one machine share its cores."""
    ranks_of: dict[str, list[int]] = {}
    for rank, p in enumerate(placement):
        ranks_of.setdefault(p.ip, []).append(rank)
    return [(ranks_of[p.ip].index(rank), len(ranks_of[p.ip])) for rank, p in enumerate(placement)]


def first_line(exc: BaseException) -> str:
    """The gist of a Ray error, whose message goes on for a page."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
