"""A headless node (``octavo serve --headless``): engine cores for a front end elsewhere.

For each of its ranks the node hand-shakes with the front end (``dp_handshake``), then
starts the engine core process with the TCP endpoint it was given and the keys both ends
derived, and tells the front end once the model is loaded. From then on the cores talk to
the front end directly; the node only waits for them.

Lifetimes are tied together so nothing lingers: a core exits when the node's process dies
(it watches its parent) or when the front end disconnects (it watches its socket); the
node exits when all its cores have exited - with 0 when the front end stopped them, 1
otherwise. SIGTERM or SIGINT stops the cores at once (the front end then fails their
requests and serves on with its other engines).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import TypeVar

import zmq

from octavo.config import EngineConfig
from octavo.engine.core_proc import EngineReady, read_handshake, start_engine_core_process
from octavo.engine.dp_handshake import (
    MAX_FRAME_BYTES,
    MAX_REASON_CHARS,
    Challenge,
    Failed,
    Hello,
    Knock,
    Ready,
    Refused,
    Welcome,
    engine_identity,
    new_nonce,
    seal,
    unseal,
)
from octavo.engine.errors import EngineStartError
from octavo.engine.expert_group_port import with_master_port
from octavo.engine.ipc import CoreEndpoint, CurveKeys, set_heartbeat

logger = logging.getLogger(__name__)

Answer = TypeVar("Answer", Challenge, Welcome)
JOIN_TIMEOUT_S = 600.0  # for the front end to answer (it may start after this node)
STOP_TIMEOUT_S = 5.0


@dataclass
class _Engine:
    rank: int
    salt: str
    dealer: zmq.Socket
    proc: BaseProcess
    handshake: multiprocessing.connection.Connection


def run_headless(config: EngineConfig, secret: bytes, model_path: Path,
                 ranks: list[int] | None = None, handle_signals: bool = True) -> int:
    """Run this node's engines (or those of ``ranks``) until they stop; the exit code.
    ``handle_signals``: SIGTERM and SIGINT stop them (only in a process's main thread)."""
    config = with_master_port(config, has_remote=True)
    parallel = config.parallel
    assert parallel.data_parallel_size_local is not None
    if ranks is None:
        ranks = list(range(parallel.data_parallel_start_rank,
                           parallel.data_parallel_start_rank + parallel.data_parallel_size_local))
    front_end = f"tcp://{parallel.data_parallel_address}:{parallel.data_parallel_rpc_port}"
    identity = engine_identity(config, model_path)
    context = zmq.Context()
    engines: list[_Engine] = []
    try:
        for rank in ranks:
            engines.append(_join(context, front_end, secret, identity,
                                 config.for_data_parallel_rank(rank)))
        for engine in engines:
            _report_ready(engine, secret)
        logger.info("headless node: %d engines (ranks %s) serve the front end at %s",
                    len(engines), ", ".join(map(str, ranks)), front_end)
        return _wait(engines, handle_signals)
    finally:
        for engine in engines:
            _stop(engine.proc)
        context.destroy(linger=0)


def _join(context: zmq.Context, front_end: str, secret: bytes, identity: dict[str, str],
          config: EngineConfig) -> _Engine:
    """Hand-shake for one rank and start its core process."""
    rank = config.parallel.engine_index
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    set_heartbeat(dealer)
    dealer.connect(front_end)
    dealer.send(seal(Knock(), secret))
    challenge = _answer(dealer, front_end, rank, secret, "", Challenge)
    hello = Hello(rank, identity, challenge.nonce, new_nonce(), socket.gethostname())
    dealer.send(seal(hello, secret, challenge.nonce))
    answer = _answer(dealer, front_end, rank, secret, hello.nonce, Welcome)
    salt = hello.nonce + answer.nonce
    keys = CurveKeys.derive(secret, salt.encode())
    endpoint = CoreEndpoint(answer.input_address, answer.output_address, keys.server_public,
                            keys.client_public, keys.client_secret, directory=None)
    proc, handshake = start_engine_core_process(config, endpoint)
    return _Engine(rank, salt, dealer, proc, handshake)


def _answer(dealer: zmq.Socket, front_end: str, rank: int, secret: bytes, salt: str,
            expected: type[Answer]) -> Answer:
    """The front end's next message, an ``expected`` one; ``EngineStartError`` otherwise."""
    if not dealer.poll(int(JOIN_TIMEOUT_S * 1000)):
        raise EngineStartError(f"engine {rank}: no answer from the front end at {front_end} "
                               f"within {JOIN_TIMEOUT_S:.0f} s (is it started with "
                               "--data-parallel-size and this address and port?)")
    answer = unseal(dealer.recv(), secret, salt)
    if isinstance(answer, Refused):
        raise EngineStartError(f"the front end refused engine {rank}: {answer.reason}")
    if not isinstance(answer, expected):
        raise EngineStartError(f"engine {rank}: unexpected answer {type(answer).__name__}")
    return answer


def _report_ready(engine: _Engine, secret: bytes) -> None:
    """Wait for the core to load its model and tell the front end how that went."""
    try:
        ready: EngineReady = read_handshake(engine.proc, engine.handshake)
    except EngineStartError as exc:
        engine.dealer.send(seal(Failed(str(exc)[:MAX_REASON_CHARS]), secret, engine.salt))
        raise
    finally:
        engine.handshake.close()
    engine.dealer.send(seal(Ready(engine.rank, ready.pid, ready.platform, ready.num_blocks,
                                  ready.max_model_len), secret, engine.salt))


def _wait(engines: list[_Engine], handle_signals: bool) -> int:
    """Until every core has exited (SIGTERM/SIGINT stop them all)."""
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        logger.info("%s: stopping this node's engines", signal.Signals(signum).name)
        for engine in engines:
            engine.proc.kill()

    for signum in (signal.SIGTERM, signal.SIGINT) if handle_signals else ():
        signal.signal(signum, stop)
    running = {engine.proc.sentinel: engine for engine in engines}
    code = 0
    while running:
        ended = multiprocessing.connection.wait(list(running))
        for sentinel in [s for s in running if s in ended]:  # ints: wait returns what it got
            engine = running.pop(sentinel)
            engine.proc.join()
            if engine.proc.exitcode != 0 and not stopping:
                logger.error("engine %d exited with code %s", engine.rank, engine.proc.exitcode)
                code = 1
    return code


def _stop(proc: BaseProcess) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT_S
    if proc.is_alive():
        proc.kill()
    proc.join(max(0.0, deadline - time.monotonic()))
