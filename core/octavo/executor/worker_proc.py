"""The process of one worker of the ``mp`` executor: ``python -m octavo.executor.worker_proc FD``.

Start-up, over the inherited pipe ``FD``: read ``WorkerInit``; bind the platform's cores;
join torch.distributed (the platform's backend, 127.0.0.1 only); load plugins and the model
(this rank's shards); create this rank's reply queue; answer ``WorkerReady`` (or the load
error's text, so the engine fails with it instead of hanging).

Then the busy loop: take each call from the broadcast queue, run it on the worker, answer
on the reply queue. A call that raises is answered with the error and the loop goes on -
but for a step that raised where the rank has peers (``ranks.StepLeftRanksApart``): the
process then exits, telling its parent why over the pipe.

The process ignores SIGINT and SIGTERM (the engine stops it with SHUTDOWN), and exits as
soon as the pipe reaches end-of-file, which is when its parent is gone, however it died -
even by SIGKILL: no worker outlives its engine.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from octavo.distributed.state import RankInfo
from octavo.executor.messages import CallCodec, CallKind, ReplyCodec, WorkerInit, WorkerReady
from octavo.executor.ranks import run_call, start_rank
from octavo.executor.shm_queue import MessageQueue
from octavo.worker.interface import WorkerInterface

logger = logging.getLogger(__name__)

def _exit_with_parent(pipe: multiprocessing.connection.Connection,
                      socket_dir: Path) -> list[Callable[[], None]]:
    """Exit once the pipe to the parent reaches end-of-file (the parent is gone), removing
    the sockets' directory, which a parent killed by SIGKILL could not remove. Returns a
    list to add clean-ups to (the reply queue's segment), run before the exit."""
    cleanups: list[Callable[[], None]] = []

    def watch() -> None:
        try:
            while True:
                pipe.recv()
        except (EOFError, OSError):
            for cleanup in cleanups:
                with contextlib.suppress(Exception):
                    cleanup()
            shutil.rmtree(socket_dir, ignore_errors=True)
            os._exit(1)

    threading.Thread(target=watch, name="worker-parent-watch", daemon=True).start()
    return cleanups


def _start(init: WorkerInit) -> tuple[WorkerInterface, RankInfo, MessageQueue, MessageQueue]:
    config = init.config
    worker, info = start_rank(config, init.rank, config.device.backend, init.init_method,
                              config.parallel.node_worker_index(init.rank))
    calls = MessageQueue.attach(init.broadcast, reader_index=info.rank)
    replies = MessageQueue.create(1, init.socket_dir)
    return worker, info, calls, replies


def _serve(worker: WorkerInterface, info: RankInfo, calls: MessageQueue,
           replies: MessageQueue) -> None:
    call_codec, reply_codec = CallCodec(), ReplyCodec()
    while True:
        kind, payload = call_codec.decode(calls.dequeue())
        if kind is CallKind.SHUTDOWN:
            return
        replies.enqueue(reply_codec.encode(run_call(worker, info, kind, payload)))


def main(fd: int) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    pipe = multiprocessing.connection.Connection(fd)
    init: WorkerInit = pipe.recv()
    # Watched from the start: a load takes a while, and the parent may die meanwhile.
    cleanups = _exit_with_parent(pipe, init.socket_dir)
    try:
        worker, info, calls, replies = _start(init)
    except BaseException as exc:
        logger.critical("worker rank %d failed to start:\n%s", init.rank, traceback.format_exc())
        pipe.send(f"worker rank {init.rank} failed to start: {type(exc).__name__}: {exc}")
        os._exit(1)
    cleanups.append(replies.close)
    pipe.send(WorkerReady(rank=info.rank, pid=os.getpid(), reply=replies.handle()))
    try:
        _serve(worker, info, calls, replies)
    except BaseException as exc:
        logger.critical("worker rank %d failed:\n%s", info.rank, traceback.format_exc())
        with contextlib.suppress(Exception):  # the parent names it in the engine's failure
            pipe.send(f"{type(exc).__name__}: {exc}")
        os._exit(1)
    replies.close()
    calls.close()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
