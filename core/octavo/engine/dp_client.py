"""``DPEngineClient``: several engine cores (data-parallel replicas) behind the interface of
one ``EngineCoreClient``, so ``AsyncLLM`` serves them as it serves one.

Each engine has its own core process (with its own executor and workers) and its own
sockets. A request, with all its samples (n > 1, which share a prompt and its prefix
blocks), goes to the engine the ``LoadBalancer`` picks; aborts go to the engine that holds
the request. Utility calls (``reset_prefix_cache``) go to every live engine.

One engine's death is not the server's: the requests it held end with an error at once,
new ones go to the survivors, and ``check_alive`` passes while one engine lives
(``/health`` then says ``degraded``). Only when every engine is gone do calls raise
``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from octavo.config import EngineConfig
from octavo.engine.balancer import LoadBalancer
from octavo.engine.core_client import EngineCoreClient, EngineDeadError, EngineStatus
from octavo.engine.core_proc import STEP_FAILED, EngineReady, EngineStartError
from octavo.engine.dp_handshake import SECRET_ENV, Ready, engine_identity
from octavo.engine.remote_client import EngineJoinServer, RemoteEngineClient
from octavo.engine.serial import EngineCoreOutputs
from octavo.outputs import EngineCoreOutput, SchedulerStats
from octavo.request import Request
from octavo.stats import PrefixCacheStats

logger = logging.getLogger(__name__)

REMOTE_START_TIMEOUT_S = 600.0  # for headless nodes to join and load their models


class DPEngineClient:
    def __init__(self, clients: list[EngineCoreClient]) -> None:
        """Use ``start_engine_client``; ``clients[i]`` is the engine of data-parallel rank i."""
        self.clients = clients
        self.balancer = LoadBalancer(len(clients))
        self._owner: dict[str, int] = {}  # engine request id -> the engine holding it
        self._outputs: asyncio.Queue[EngineCoreOutputs | EngineDeadError] = asyncio.Queue()
        self._forwarders = [asyncio.get_running_loop().create_task(self._forward(index))
                            for index in range(len(clients))]

    @property
    def dead(self) -> bool:
        return all(client.dead for client in self.clients)

    @property
    def degraded(self) -> bool:
        """Some engines are dead, not all."""
        return not self.dead and any(client.dead for client in self.clients)

    def add_requests(self, requests: list[Request]) -> None:
        """Send a user request's samples to the least loaded live engine."""
        self.check_alive()
        index = self.balancer.pick()
        for request in requests:
            self.clients[index].add_request(request)
            self._owner[request.request_id] = index
        self.balancer.assign(index, len(requests))

    def abort_requests(self, request_ids: list[str]) -> None:
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self._owner.pop(request_id, None)
            if index is not None:
                by_engine.setdefault(index, []).append(request_id)
        for index, ids in by_engine.items():
            self.clients[index].abort_requests(ids)

    async def call_utility(self, method: str, *args: Any) -> Any:
        """The call on every live engine; the first engine's result."""
        self.check_alive()
        results = await asyncio.gather(*(client.call_utility(method, *args)
                                         for client in self.clients if not client.dead))
        return results[0]

    async def get_output(self) -> EngineCoreOutputs:
        item = await self._outputs.get()
        if isinstance(item, EngineDeadError):
            self._outputs.put_nowait(item)  # every later call fails the same way
            raise item
        return item

    def check_alive(self) -> None:
        if self.dead:
            raise EngineDeadError(self.death_message())

    def death_message(self) -> str:
        return "; ".join(client.death_message() for client in self.clients if client.dead)

    def statuses(self) -> list[EngineStatus]:
        return [EngineStatus(index, not client.dead, client.pid)
                for index, client in enumerate(self.clients)]

    def shutdown(self) -> None:
        for forwarder in self._forwarders:
            forwarder.cancel()
        for client in self.clients:
            client.shutdown()
        self._outputs.put_nowait(EngineDeadError("the engine was shut down"))

    async def _forward(self, index: int) -> None:
        """Move engine ``index``'s outputs to the shared queue, keeping its load and the
        ownership table current; on its death, fail the requests it held."""
        client = self.clients[index]
        try:
            while True:
                message = await client.get_output()
                self.balancer.update(index, message.scheduler_stats,
                                     message.num_requests_received)
                for output in message.outputs:
                    if output.finished:
                        self._owner.pop(output.request_id, None)
                self._outputs.put_nowait(message)
        except EngineDeadError as exc:
            self._on_engine_death(index, str(exc))

    def _on_engine_death(self, index: int, reason: str) -> None:
        self.balancer.mark_dead(index)
        held = [rid for rid, owner in self._owner.items() if owner == index]
        for request_id in held:
            del self._owner[request_id]
        survivors = sum(not client.dead for client in self.clients)
        logger.error("data-parallel engine %d died (%s); %d requests it held failed, %d "
                     "engines serve on", index, reason, len(held), survivors)
        error = f"data-parallel engine {index} died while running this request: {reason}"
        failed = [EngineCoreOutput(rid, [], finish_reason=STEP_FAILED, error=error)
                  for rid in held]
        stopped = SchedulerStats(0, 0, 0.0, PrefixCacheStats())
        self._outputs.put_nowait(EngineCoreOutputs(failed, stopped, engine_index=index))
        if self.dead:
            self._outputs.put_nowait(EngineDeadError(self.death_message()))


def engine_config(config: EngineConfig, rank: int) -> EngineConfig:
    """The config of data-parallel engine ``rank``."""
    return replace(config, parallel=replace(config.parallel, data_parallel_rank=rank))


async def start_engine_client(config: EngineConfig, secret: bytes | None = None,
                              ) -> tuple[EngineCoreClient | DPEngineClient, EngineReady]:
    """Start this node's engine cores, concurrently, and wait for them and for the engines
    of headless nodes (``secret`` authenticates those); one engine is served by its
    ``EngineCoreClient`` alone. If any cannot start, those that did are stopped and its
    ``EngineStartError`` is raised."""
    parallel = config.parallel
    if parallel.data_parallel_size == 1:
        return await EngineCoreClient.start(config)
    assert parallel.data_parallel_size_local is not None
    local = list(range(parallel.data_parallel_start_rank,
                       parallel.data_parallel_start_rank + parallel.data_parallel_size_local))
    remote = [rank for rank in range(parallel.data_parallel_size) if rank not in local]
    join = _join_server(config, secret, remote) if remote else None
    try:
        results = await asyncio.gather(
            *(EngineCoreClient.start(engine_config(config, rank)) for rank in local),
            join.gather(REMOTE_START_TIMEOUT_S) if join is not None else _no_engines(),
            return_exceptions=True)
    finally:
        if join is not None:
            join.close()  # the engines that joined keep their own sockets
    started = results[:-1]
    clients = [result[0] for result in started if not isinstance(result, BaseException)]
    if join is not None:
        clients += [join.ready[rank][0] for rank in remote if rank in join.ready]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        for client in clients:
            client.shutdown()
        raise failure
    readies = [result[1] for result in started]  # type: ignore[index]
    logger.info("%d data-parallel engines ready: %d here (pids %s), %d on headless nodes",
                len(clients), len(local), ", ".join(str(r.pid) for r in readies), len(remote))
    return DPEngineClient(clients), readies[0]


async def _no_engines() -> dict[int, tuple[RemoteEngineClient, Ready]]:
    return {}


def _join_server(config: EngineConfig, secret: bytes | None,
                 remote: list[int]) -> EngineJoinServer:
    from octavo.models.loader import default_model_path

    parallel = config.parallel
    if not secret:
        raise EngineStartError(f"engines {remote} are to join from headless nodes, which needs "
                               f"a shared secret: --data-parallel-secret or {SECRET_ENV} (the "
                               "same on every node)")
    if parallel.data_parallel_size_local == 0:
        raise EngineStartError("data_parallel_size_local=0: the front end runs at least one "
                               "engine (its tokenizer and limits come from it)")
    model_path = Path(config.model.model) if config.model.model else default_model_path()
    return EngineJoinServer(parallel.data_parallel_address, parallel.data_parallel_rpc_port,
                            secret, engine_identity(config, model_path), remote)
