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
from collections.abc import Callable
from typing import Any

from octavo.engine.balancer import LoadBalancer
from octavo.engine.core_client import EngineCoreClient, EngineStatus, next_output
from octavo.engine.errors import EngineDeadError
from octavo.outputs import STEP_FAILED, EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from octavo.request import Request

logger = logging.getLogger(__name__)


class DPEngineClient:
    def __init__(self, clients: list[EngineCoreClient],
                 on_shutdown: Callable[[], None] | None = None) -> None:
        """Use ``octavo.engine.launch.start_engine_client``; ``clients[i]`` is the engine of
        data-parallel rank i; ``on_shutdown`` releases what placed them (Ray actors)."""
        self.clients = clients
        self._on_shutdown = on_shutdown
        self.balancer = LoadBalancer(len(clients))
        self._owner: dict[str, int] = {}  # engine request id -> the engine holding it
        self._outputs: asyncio.Queue[EngineCoreOutputs | EngineDeadError] = asyncio.Queue()
        self._forwarders = [asyncio.get_running_loop().create_task(self._forward(index))
                            for index in range(len(clients))]

    @property
    def dead(self) -> bool:
        return all(client.dead for client in self.clients)

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
        return await next_output(self._outputs)

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
        if self._on_shutdown is not None:
            self._on_shutdown()
            self._on_shutdown = None
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
        self._outputs.put_nowait(EngineCoreOutputs(failed, SchedulerStats.stopped(),
                                                   engine_index=index))
        if self.dead:
            self._outputs.put_nowait(EngineDeadError(self.death_message()))
