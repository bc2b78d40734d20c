"""``MultiprocExecutor`` (``mp``): one worker process per rank on this machine.

Each step's ``SchedulerOutput`` is written once into a shared-memory broadcast queue that
every worker reads (``octavo.executor.shm_queue``); each worker answers on a reply queue of
its own, and the output rank's answer is the step's result. Between themselves the workers
talk torch.distributed with the platform's backend, rendezvousing on 127.0.0.1; gloo is
pinned to the loopback interface (``GLOO_SOCKET_IFNAME=lo``), so no byte leaves the machine.

Worker processes are started with ``subprocess`` (not ``multiprocessing``: the engine core
is itself a daemonic process, which ``multiprocessing`` forbids to have children), each
holding one end of a socket pair: the start-up handshake travels on it, and a worker exits
when it reads end-of-file, i.e. when the engine process is gone, however it died.

With pipeline stages, steps are pipelined (``submit_step``): the step is written into the
broadcast queue at once and a collector thread reads the replies, step after step, into
each step's future, so stage 0 computes step N+1 while stage 1 computes step N (with async
scheduling, the workers compute step N while the engine core plans step N+1; each rank
still runs its steps in order, so one step's KV writes come before the next's). A blocking
call (``collective_rpc``, ``execute_model``) first waits for the steps in flight: replies
are read in the order the calls were written.

A monitor thread waits on every worker's exit. When one dies unasked, the executor shuts
down the others, a step waiting for answers raises ``WorkerDiedError`` at once, and
``on_failure`` (the engine core process's: exit, so the front end reports the engine dead)
runs.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.connection
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from octavo.config import EngineConfig
from octavo.executor.base import WorkerDiedError
from octavo.executor.messages import CallKind, WorkerInit, WorkerReady
from octavo.executor.ranks import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, RankedExecutor
from octavo.executor.shm_queue import MessageQueue, QueueClosed
from octavo.models.loader import ModelFiles
from octavo.net import free_port
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.paths import make_socket_dir
from octavo.platforms import Platform

logger = logging.getLogger(__name__)


class MultiprocExecutor(RankedExecutor):
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(config, platform, files, on_failure)
        self.socket_dir = make_socket_dir()
        self.calls = MessageQueue.create(self.world_size, self.socket_dir)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.replies: list[MessageQueue] = []
        # Micro-batches: one step per pipeline stage in flight, unless turned off; async
        # scheduling: the step running and the one planned beside it.
        self._max_in_flight = (config.parallel.pipeline_parallel_size
                               if config.parallel.enable_pipeline_micro_batching
                               else 2 if config.scheduler.async_scheduling else 1)
        self._collector = ThreadPoolExecutor(1, thread_name_prefix="executor-collect")
        self._in_flight: deque[Future[ModelRunnerOutput]] = deque()
        try:
            self._start_workers(config)
        except BaseException as exc:
            self.failure = f"the workers did not start: {exc}"  # no polite SHUTDOWN
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch_workers, name="executor-monitor",
                                         daemon=True)
        self._monitor.start()
        # An engine its owner never shuts down (a script's LLM) stops its workers at exit,
        # before the workers would notice on their own, so every segment is released.
        atexit.register(self.shutdown)

    # -- start-up -----------------------------------------------------------------------
    def _start_workers(self, config: EngineConfig) -> None:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        for rank in range(self.world_size):
            ours, theirs = socket.socketpair()
            proc = subprocess.Popen(
                [sys.executable, "-m", "octavo.executor.worker_proc", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env)
            theirs.close()
            self.procs.append(proc)
            pipe = multiprocessing.connection.Connection(ours.detach())
            self.pipes.append(pipe)
            pipe.send(WorkerInit(config=config, rank=rank, init_method=init_method,
                                 broadcast=self.calls.handle(), socket_dir=self.socket_dir))
        ready = self._read_handshakes()
        self.replies = [MessageQueue.attach(r.reply, reader_index=0) for r in ready]
        logger.info("%d workers ready (pids %s)", self.world_size,
                    ", ".join(str(r.pid) for r in ready))

    def _read_handshakes(self) -> list[WorkerReady]:
        """Every worker's ``WorkerReady``, in rank order, taken as they come: the first
        worker that fails (its error text, or its exit) fails the start at once, rather
        than after the ranks before it, which would wait for it in torch.distributed."""
        ready: dict[int, WorkerReady] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < self.world_size:
            pending = [p for rank, p in enumerate(self.pipes) if rank not in ready]
            answered = multiprocessing.connection.wait(pending, deadline - time.monotonic())
            if not answered:
                raise WorkerDiedError(f"{len(pending)} worker(s) not ready after "
                                      f"{STARTUP_TIMEOUT_S:.0f} s")
            for pipe in answered:
                rank = self.pipes.index(pipe)  # type: ignore[arg-type]
                ready[rank] = self._handshake(rank)
        return [ready[rank] for rank in range(self.world_size)]

    def _handshake(self, rank: int) -> WorkerReady:
        try:
            message = self.pipes[rank].recv()
        except EOFError:
            code = self.procs[rank].wait()
            raise WorkerDiedError(f"worker rank {rank} exited with code {code} before it "
                                  "was ready") from None
        if isinstance(message, WorkerReady):
            return message
        raise WorkerDiedError(message)

    # -- calls --------------------------------------------------------------------------
    @property
    def max_concurrent_batches(self) -> int:
        return self._max_in_flight

    def submit_step(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        """Write the step for every worker now; the collector thread reads its replies
        once those of the steps before it are read."""
        self.check_health()
        self._post(self._call_codec.encode(CallKind.EXECUTE, scheduler_output))
        future = self._collector.submit(
            lambda: self._step_output(self._fold(self._collect())))
        self._in_flight.append(future)
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft()
        return future

    def _send(self, message: bytes) -> list[bytes]:
        """Through the broadcast queue to every worker; each answers on its reply queue.
        The steps in flight are answered first (their replies come first)."""
        wait(self._in_flight)
        self._in_flight.clear()
        self._post(message)
        return self._collect()

    def _post(self, message: bytes) -> None:
        try:
            self.calls.enqueue(message, self._is_dead)
        except QueueClosed:
            raise WorkerDiedError(self.failure or "the workers were shut down") from None

    def _collect(self) -> list[bytes]:
        """Every worker's reply to the oldest call not yet answered, in rank order."""
        try:
            return [queue.dequeue(self._is_dead) for queue in self.replies]
        except QueueClosed:
            raise WorkerDiedError(self.failure or "the workers were shut down") from None

    def _is_dead(self) -> bool:
        return self.failure is not None or self._stopping

    # -- failure and shutdown -----------------------------------------------------------
    def _watch_workers(self) -> None:
        """Wait for any worker's pipe to close (its process exited); unless the executor
        is stopping, that is the engine's failure: the other workers are killed (they
        would wait forever on a collective with the dead one) and ``on_failure`` runs."""
        try:
            ready = multiprocessing.connection.wait(self.pipes)
        except (OSError, ValueError):  # the pipes were closed by shutdown
            return
        if self._stopping:
            return
        rank = self.pipes.index(ready[0])  # type: ignore[arg-type]
        why = _last_words(self.pipes[rank])
        code = self.procs[rank].wait()
        self.failure = (f"worker rank {rank} (pid {self.procs[rank].pid}) died with code "
                        f"{code}" + (f": {why}" if why else ""))
        logger.error("%s; stopping the other workers", self.failure)
        self._stop_workers(timeout_s=0.0)
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def _stop_workers(self, timeout_s: float) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.shutdown)
        if self.failure is None and self.replies:  # alive: ask politely first
            try:
                self.calls.enqueue(self._call_codec.encode(CallKind.SHUTDOWN),
                                   lambda: self.failure is not None)
            except QueueClosed:
                pass
        self._stop_workers(STOP_TIMEOUT_S if self.failure is None else 0.0)
        # Every step in flight is answered (WorkerDiedError: the executor is stopping)
        # before the queues its collector reads are closed.
        self._collector.shutdown(wait=True)
        for queue in [self.calls, *self.replies]:
            queue.close()
        for pipe in self.pipes:
            pipe.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _last_words(pipe: multiprocessing.connection.Connection) -> str | None:
    """What a worker that ended on an error sent before it exited (``worker_proc.main``);
    None for one that died without a word (killed)."""
    try:
        message = pipe.recv()
    except (EOFError, OSError):
        return None
    return message if isinstance(message, str) else None
