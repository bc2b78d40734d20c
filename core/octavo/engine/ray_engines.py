"""Data-parallel engines as Ray actors (``--data-parallel-backend ray``).

The front end places one ``EngineActor`` per data-parallel rank on the Ray cluster, in a
placement group of one bundle per engine (its workers' CPUs, or GPUs), and each actor does
for its rank what a headless node does (``octavo.engine.headless``): it hand-shakes with
the front end - with a secret made for this launch, passed in the actor's arguments -
starts the engine core process on its node and waits for it. The front end then serves
them as it serves headless engines (``RemoteEngineClient``). The actors reach the front end
at ``--data-parallel-address``, which must be an address of the front end's node that
every Ray node can reach (127.0.0.1 when the cluster is this one machine).

Lifetimes: an actor belongs to the front end's Ray job and ends with it; its core process
ends with the actor (it watches its parent) or when the front end disconnects; ``shutdown``
kills the actors and removes the placement group.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from octavo.config import EngineConfig
from octavo.engine.errors import EngineStartError
from octavo.engine.headless import run_headless
from octavo.executor.ray_placement import (
    NodePlacement,
    connect,
    in_bundle,
    placement_of,
    ray_resource,
    release,
    reserve,
)
from octavo.platforms import Platform

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=0)  # type: ignore[call-overload]
class EngineActor:
    def run(self, config: EngineConfig, secret: bytes, model_path: str) -> int:
        """Join the front end as engine ``data_parallel_rank`` and serve until the core
        process exits; its exit code."""
        return run_headless(config, secret, Path(model_path),
                            ranks=[config.parallel.engine_index], handle_signals=False)


class RayEngines:
    """The data-parallel engines' actors, started; ``watch()`` fails when one ends."""

    def __init__(self, config: EngineConfig, platform: type[Platform], secret: bytes,
                 model_path: Path) -> None:
        parallel = config.parallel
        self._joined = connect("data_parallel_backend", "data-parallel engines")
        self._group: Any = None
        self.actors: list[Any] = []
        try:
            resource = ray_resource(platform)
            self._group = reserve(resource, parallel.data_parallel_size, parallel.world_size,
                                  f"data_parallel_size={parallel.data_parallel_size} engines "
                                  f"of {parallel.world_size} workers")
            placement = placement_of(self._group)
            self.runs = [self._start(rank, config, placement, secret, model_path)
                         for rank in range(parallel.data_parallel_size)]
        except BaseException:
            self.shutdown()
            raise
        logger.info("%d data-parallel engine actors placed on Ray nodes %s",
                    len(self.actors), ", ".join(p.ip for p in placement))

    def _start(self, rank: int, config: EngineConfig, placement: list[NodePlacement],
               secret: bytes, model_path: Path) -> Any:
        actor = EngineActor.options(scheduling_strategy=in_bundle(self._group, rank)).remote()  # type: ignore[attr-defined]
        self.actors.append(actor)
        return actor.run.remote(engine_on_node(config, rank, placement), secret, str(model_path))

    async def watch(self) -> None:
        """Raise ``EngineStartError`` as soon as an actor's run ends (it could not start:
        refused, or its load failed); never returns otherwise."""
        done, _ = await asyncio.wait([asyncio.ensure_future(run) for run in self.runs],
                                     return_when=asyncio.FIRST_COMPLETED)
        try:
            code = done.pop().result()
        except Exception as exc:
            raise EngineStartError(f"a data-parallel engine actor failed: {exc}") from None
        raise EngineStartError(f"a data-parallel engine actor ended with code {code}")

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors.clear()
        release(self._group, self._joined)
        self._group, self._joined = None, False


def engine_on_node(config: EngineConfig, rank: int,
                   placement: list[NodePlacement]) -> EngineConfig:
    """Engine ``rank``'s config, its node's share of the cores included: the engines whose
    bundles are on one machine (one address) split its cores as engines of one node do."""
    here = [r for r, p in enumerate(placement) if p.ip == placement[rank].ip]
    index = here.index(rank)
    return replace(config, parallel=replace(
        config.parallel, data_parallel_rank=rank, data_parallel_start_rank=rank - index,
        data_parallel_size_local=len(here)))
