"""``start_engine_client``: the engines ``AsyncLLM`` serves, started, whatever their kind.

- One engine (``data_parallel_size=1``): its core process, behind an ``EngineCoreClient``.
- Data-parallel engines on this node and on headless nodes: this node's core processes
  start concurrently while the join server takes the headless engines' handshakes; the
  front end is ready once every engine is.
- ``data_parallel_backend='ray'``: every engine is a Ray actor, joining as a headless
  engine does, with a secret made for this launch.

When no engine runs on this node, the tokenizer and limits the front end needs come from
the model's files, loaded here (not its weights). Whatever fails, the engines that did
start are stopped, and the failure is raised.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

from octavo.config import EngineConfig
from octavo.engine.core_client import EngineCoreClient
from octavo.engine.core_proc import EngineReady
from octavo.engine.dp_client import DPEngineClient
from octavo.engine.dp_handshake import SECRET_ENV, Ready, engine_identity
from octavo.engine.errors import EngineStartError
from octavo.engine.expert_group_port import with_master_port
from octavo.engine.remote_client import EngineJoinServer

logger = logging.getLogger(__name__)

REMOTE_START_TIMEOUT_S = 600.0  # for headless engines to join and load their models
Engines = EngineCoreClient | DPEngineClient


def model_path(config: EngineConfig) -> Path:
    from octavo.models.loader import default_model_path

    return Path(config.model.model) if config.model.model else default_model_path()


async def start_engine_client(config: EngineConfig, secret: bytes | None = None,
                              ) -> tuple[Engines, EngineReady]:
    """The engines started and ready (``secret`` authenticates headless engines), with the
    ``EngineReady`` the front end builds its processor from."""
    parallel = config.parallel
    if parallel.data_parallel_backend == "ray":
        return await _start_on_ray(config)
    if parallel.data_parallel_size == 1:
        return await EngineCoreClient.start(config)
    assert parallel.data_parallel_size_local is not None
    local = list(range(parallel.data_parallel_start_rank,
                       parallel.data_parallel_start_rank + parallel.data_parallel_size_local))
    remote = [rank for rank in range(parallel.data_parallel_size) if rank not in local]
    if remote and not secret:
        raise EngineStartError(f"engines {remote} are to join from headless nodes, which needs "
                               f"a shared secret: --data-parallel-secret or {SECRET_ENV} (the "
                               "same on every node)")
    config = with_master_port(config, bool(remote))
    join = _join_server(config, secret, remote) if remote else None
    try:
        results = await asyncio.gather(
            *(EngineCoreClient.start(config.for_data_parallel_rank(rank)) for rank in local),
            _joined(join), return_exceptions=True)
    finally:
        if join is not None:
            join.close()  # the engines that joined keep their own sockets
    started = [result for result in results[:-1] if isinstance(result, tuple)]
    clients = [client for client, _ in started]
    if join is not None:
        clients += [join.ready[rank][0] for rank in remote if rank in join.ready]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        _stop(clients)
        raise failure
    readies = [ready for _, ready in started]
    logger.info("%d data-parallel engines ready: %d here (pids %s), %d on headless nodes",
                len(clients), len(local), ", ".join(str(r.pid) for r in readies), len(remote))
    if readies:
        return DPEngineClient(clients), readies[0]
    assert join is not None
    return DPEngineClient(clients), await _front_end_ready(config, join.ready[remote[0]][1])


async def _start_on_ray(config: EngineConfig) -> tuple[Engines, EngineReady]:
    from octavo.engine.ray_engines import RayEngines
    from octavo.plugins.resolve import resolve_platform

    secret = secrets.token_bytes(32)
    ranks = list(range(config.parallel.data_parallel_size))
    join = _join_server(config, secret, ranks)
    engines: RayEngines | None = None
    try:
        platform = await asyncio.to_thread(resolve_platform, config.device.backend)
        engines = await asyncio.to_thread(RayEngines, config, platform, secret,
                                          model_path(config))
        gathering = asyncio.ensure_future(join.gather(REMOTE_START_TIMEOUT_S))
        watching = asyncio.ensure_future(engines.watch())
        done, _ = await asyncio.wait([gathering, watching],
                                     return_when=asyncio.FIRST_COMPLETED)
        if watching in done:  # an actor ended before every engine joined
            gathering.cancel()
            await watching  # raises why
        watching.cancel()
        joined = gathering.result()
        ready = await _front_end_ready(config, joined[0][1])
    except BaseException:
        _stop([client for client, _ in join.ready.values()])
        if engines is not None:
            engines.shutdown()
        raise
    finally:
        join.close()
    logger.info("%d data-parallel engines ready on Ray", len(ranks))
    return DPEngineClient([joined[rank][0] for rank in ranks], engines.shutdown), ready


async def _joined(join: EngineJoinServer | None) -> None:
    """Until every headless engine has joined (``join.ready`` holds them); none: at once."""
    if join is not None:
        await join.gather(REMOTE_START_TIMEOUT_S)


def _join_server(config: EngineConfig, secret: bytes | None,
                 ranks: list[int]) -> EngineJoinServer:
    parallel = config.parallel
    assert secret is not None
    return EngineJoinServer(parallel.data_parallel_address, parallel.data_parallel_rpc_port,
                            secret, engine_identity(config, model_path(config)), ranks)


async def _front_end_ready(config: EngineConfig, remote: Ready) -> EngineReady:
    """What a local engine's handshake would give, from the model's files (tokenizer and
    config; the weights stay unread) and a remote engine's ``Ready``."""
    from octavo.engine.llm_engine import resolve_max_model_len
    from octavo.models.generation_config import read_generation_config
    from octavo.models.loader import load_model_files

    files = await asyncio.to_thread(load_model_files, config.model.model)
    max_model_len = resolve_max_model_len(config, files)
    if max_model_len != remote.max_model_len:
        raise EngineStartError(f"the engines' max_model_len is {remote.max_model_len}, the "
                               f"front end's {max_model_len}")
    return EngineReady(pid=remote.pid, platform=remote.platform, model=str(files.source),
                       num_blocks=remote.num_blocks, block_size=config.cache.block_size,
                       max_model_len=max_model_len,
                       enable_prefix_caching=config.cache.enable_prefix_caching,
                       hf_config=files.hf_config,
                       tokenizer=files.tokenizer,
                       generation_config=read_generation_config(
                           files, config.model.generation_config))


def _stop(clients: list[EngineCoreClient]) -> None:
    for client in clients:
        client.shutdown()


