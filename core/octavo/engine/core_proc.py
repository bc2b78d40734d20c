"""``EngineCoreProc``: the engine core in its own process, fed over ZMQ.

Why a process: the model's forward pass holds the GIL for most of a step, so in the API
process it would stall HTTP handling, tokenization and detokenization. In its own process
the core steps back to back while the front end does the rest.

Three threads, so the busy loop never waits on sockets:
- the input thread reads messages (add, abort, utility, shutdown) into a queue, dropping
  (and logging) any that does not decode - but a request that can be named is refused
  rather than left without an answer;
- the main thread runs the busy loop: apply queued messages, step while there is work,
  block on the queue when idle;
- the output thread encodes and sends each step's outputs and scheduler stats.

The sockets are CURVE clients of the API process's, over ``ipc://`` paths in a private
directory, with the keys this launch's spawn arguments carry (``octavo.engine.ipc``).

No request's failure stops the process: a request the core refuses fails alone with a
per-request error, and so do the requests of a step that raises (``EngineCore.step``);
the others run on. Only when steps keep failing (``MAX_CONSECUTIVE_FAILED_STEPS`` in a
row: the engine's state, not a request, is broken) does the process exit non-zero.

Start-up is a handshake over a pipe: ``EngineReady`` (what the front end needs: the
tokenizer, limits, KV blocks) or the load error's text, so the server can exit with it
instead of hanging. The process ignores SIGINT and SIGTERM (the server stops it with a
SHUTDOWN message after draining) and watches its parent, exiting when it is gone: a killed
server leaves no orphan holding memory.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from octavo.config import ConfigError, EngineConfig, PoolerConfig
from octavo.engine.errors import EngineStartError, StepError
from octavo.engine.ipc import TCP_FRAME_BYTES, CoreEndpoint
from octavo.engine.serial import (
    Decoder,
    Encoder,
    OutputKind,
    RequestKind,
    log_dropped_frame,
    split_payload,
    undecodable_request_id,
)
from octavo.outputs import (
    STEP_FAILED,
    EngineCoreOutput,
    EngineCoreOutputs,
    SchedulerStats,
    UtilityCall,
    UtilityResult,
)
from octavo.plugins import get_registries
from octavo.plugins.resolve import PlatformError, check_names, resolve_platform
from octavo.request import Request

if TYPE_CHECKING:
    from octavo.engine.dp_lockstep import DPLockstep
    from octavo.models.generation_config import GenerationConfig

logger = logging.getLogger(__name__)

_SHUTDOWN = object()  # tells the output thread to stop
# Steps failing this many times in a row, with no step succeeding in between, mean the
# engine itself is broken (its device, its memory), not one request: exit, don't spin.
MAX_CONSECUTIVE_FAILED_STEPS = 5
# While it has work the core reports at least this often, news or not: the front end takes
# silence from a busy core for longer than --engine-stall-timeout as a stall.
HEARTBEAT_S = 1.0


@dataclass
class EngineReady:
    """The handshake of a core process that loaded its model (sent pickled over a pipe)."""

    pid: int
    platform: str
    model: str  # the HF folder or .gguf file loaded
    num_blocks: int
    block_size: int
    max_model_len: int
    # As the core settled it (a pooling model that reads prompts whole turns it off).
    enable_prefix_caching: bool
    hf_config: dict[str, Any]  # vocab size, EOS, ... for the front end's Processor
    tokenizer: Any  # the model's tokenizer, so the front end need not load it again
    # More EOS ids and the sampling defaults (octavo.models.generation_config), for the same.
    generation_config: GenerationConfig | None = None
    # A pooling engine's settled pooler config (runner=pooling); None: generation.
    pooler: PoolerConfig | None = None


@dataclass
class UndecodableRequest:
    """An ADD message that failed to decode but names its request: refused on arrival."""

    request_id: str
    reason: str


class EngineCoreProc:
    def __init__(self, config: EngineConfig, endpoint: CoreEndpoint) -> None:
        # Imported here, in the core process only: the server imports this module to spawn
        # the core, and should not first wait for the model stack (transformers, loaders).
        from octavo.engine.core import EngineCore
        from octavo.engine.dp_lockstep import DPLockstep
        from octavo.engine.llm_engine import pooler_of, resolve_max_model_len
        from octavo.models.generation_config import read_generation_config
        from octavo.models.loader import load_model_files

        platform = resolve_platform(config.device.backend)
        check_names(config, get_registries(), platform)  # before the model load, not after
        # Before the workers start: they meet on the store engine 0's lockstep serves.
        self.lockstep = (DPLockstep(config.parallel)
                         if config.parallel.experts_across_engines else None)
        files = load_model_files(config.model.model)
        max_model_len = resolve_max_model_len(config, files)
        generation_config = read_generation_config(files, config.model.generation_config)
        generation_config.sampling_defaults()  # a bad file fails the start, not each request
        self.core = EngineCore(config, platform, files, max_model_len,
                               on_executor_failure=_exit_on_worker_death)
        self.ready = EngineReady(
            pid=os.getpid(), platform=platform.name, model=str(files.source),
            num_blocks=self.core.num_blocks, block_size=config.cache.block_size,
            max_model_len=max_model_len,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            hf_config=files.hf_config, tokenizer=files.tokenizer,
            generation_config=generation_config, pooler=pooler_of(config))
        self.inputs: queue.Queue[tuple[RequestKind, Any]] = queue.Queue()
        self.outputs: queue.Queue[Any] = queue.Queue()
        self.context = zmq.Context()
        self.endpoint = endpoint
        self.engine_index = config.parallel.engine_index
        self._reported: tuple[SchedulerStats, int] | None = None  # stats, requests taken in
        self._reported_at = 0.0  # time.monotonic() of the last report
        self._failed_steps = 0  # in a row
        self._num_received = 0  # ADD messages taken in
        self.stopping = threading.Event()  # told to stop: a disconnect is no failure then
        # The first message, sent as the output socket connects: a headless engine's front
        # end learns from it which TCP connection is the engine's (RemoteEngineClient).
        self.outputs.put(self._message([], self.core.scheduler.make_stats()))
        self.input_thread = _start_thread("input", self._receive_inputs)
        self.output_thread = _start_thread("output", self._send_outputs)

    def run_busy_loop(self) -> None:
        """Step while there is work; return on SHUTDOWN."""
        if self.lockstep is not None:
            self._run_lockstep_loop(self.lockstep)
            return
        while self._apply_inputs(block=not self.core.has_unfinished_requests()):
            if self.core.has_unfinished_requests():
                self._report(self._step())

    def _run_lockstep_loop(self, lockstep: DPLockstep) -> None:
        """Step whenever any engine of the expert group has work (this one with nothing
        scheduled runs a dummy batch); return when any engine is told to stop."""
        while True:
            stopping = not self._apply_inputs(block=not self.core.has_unfinished_requests(),
                                              timeout=lockstep.idle_poll_s)
            busy = self.core.has_unfinished_requests()
            any_work, any_stopping = lockstep.agree(busy, stopping)
            if any_stopping:
                return
            if any_work:
                outputs = self._step()
                if busy:
                    self._report(outputs)

    def _step(self) -> list[EngineCoreOutput]:
        """One step. A failed one costs only its requests, each answered with an error;
        ``MAX_CONSECUTIVE_FAILED_STEPS`` in a row end the process (the error propagates)."""
        applied = self.core.steps_applied
        try:
            outputs = self.core.step()
        except StepError as exc:
            self._failed_steps += 1
            if self._failed_steps >= MAX_CONSECUTIVE_FAILED_STEPS:
                logger.critical("%d steps in a row failed: the engine is broken",
                                self._failed_steps)
                raise
            logger.error("%s; its requests were aborted: %s", exc, ", ".join(exc.request_ids),
                         exc_info=exc)
            error = (f"the engine failed while running this request "
                     f"({type(exc.cause).__name__}); see the server log")
            return [EngineCoreOutput(request_id, [], finish_reason=STEP_FAILED, error=error)
                    for request_id in exc.request_ids]
        if self.core.steps_applied > applied:  # not a call that only sent a step
            self._failed_steps = 0
        return outputs

    def shutdown(self) -> None:
        """Send what is queued, then close the sockets (the input thread closed its own)."""
        self.stopping.set()
        self.outputs.put(_SHUTDOWN)
        self.output_thread.join()
        self.input_thread.join()
        self.context.term()
        self.core.shutdown()

    def _apply_inputs(self, block: bool, timeout: float | None = None) -> bool:
        """Apply every queued message, first waiting for one (up to ``timeout`` s) if
        ``block``; False on SHUTDOWN.

        When the core is left idle by what was applied (e.g. aborts of the last requests),
        no step follows to report its state, so it is reported here.
        """
        applied = False
        while True:
            try:
                kind, payload = self.inputs.get(block=block and not applied, timeout=timeout)
            except queue.Empty:
                break
            applied = True
            if kind is RequestKind.SHUTDOWN:
                return False
            if kind is RequestKind.ADD:
                self._add_request(payload)
            elif kind is RequestKind.ABORT:
                self.core.abort_requests(payload)
            elif kind is RequestKind.UTILITY:
                self.outputs.put(self._call_utility(payload))
        if applied and not self.core.has_unfinished_requests():
            self._report([])
        return True

    def _add_request(self, request: Request | UndecodableRequest) -> None:
        """A request the engine refuses fails alone, with the reason, and the engine runs on."""
        self._num_received += 1
        if isinstance(request, UndecodableRequest):
            self._refuse(request.request_id, request.reason)
            return
        try:
            self.core.add_request(request)
        except Exception as exc:
            self._refuse(request.request_id, str(exc))

    def _refuse(self, request_id: str, reason: str) -> None:
        logger.warning("request %s refused: %s", request_id, reason)
        refused = EngineCoreOutput(request_id, [], finish_reason="abort", error=reason)
        self.outputs.put(self._message([refused], self.core.scheduler.make_stats()))

    def _report(self, outputs: list[EngineCoreOutput]) -> None:
        """Send the outputs and the scheduler's state after a step; when neither is news (a
        step of a long prefill chunk, say) only once per ``HEARTBEAT_S``, so the front end
        is not flooded and still hears that the core steps."""
        stats = self.core.scheduler.make_stats()
        news = (stats, self._num_received)
        now = time.monotonic()
        if outputs or news != self._reported or now - self._reported_at >= HEARTBEAT_S:
            self.outputs.put(self._message(outputs, stats))
            self._reported, self._reported_at = news, now

    def _message(self, outputs: list[EngineCoreOutput], stats: SchedulerStats,
                 ) -> EngineCoreOutputs:
        return EngineCoreOutputs(outputs, stats, self.engine_index, self._num_received)

    def _call_utility(self, call: UtilityCall) -> UtilityResult:
        method = getattr(self.core, call.method, None)
        if method is None or call.method.startswith("_"):
            return UtilityResult(call.call_id, error=f"EngineCore has no method {call.method!r}")
        try:
            return UtilityResult(call.call_id, result=method(*call.args))
        except Exception as exc:  # the caller gets the error; the engine keeps running
            return UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")

    def _receive_inputs(self) -> None:
        socket = self.endpoint.connect(self.context, zmq.PULL, self.endpoint.input_address)
        decoder = Decoder(RequestKind)
        while True:
            frames = socket.recv_multipart(copy=False)
            buffers = [frame.buffer for frame in frames]
            try:
                kind, payload = decoder.decode(buffers)
            except Exception as exc:  # a bad frame is dropped, never the engine's death
                log_dropped_frame("input", exc)
                if (request_id := undecodable_request_id(buffers)) is not None:
                    reason = f"the engine cannot decode the request: {exc}"
                    self.inputs.put((RequestKind.ADD, UndecodableRequest(request_id, reason)))
                continue
            self.inputs.put((kind, payload))
            if kind is RequestKind.SHUTDOWN:
                socket.close()
                return

    def _send_outputs(self) -> None:
        socket = self.endpoint.connect(self.context, zmq.PUSH, self.endpoint.output_address)
        if self.endpoint.is_tcp:
            _exit_when_disconnected(socket, self.endpoint.output_address, self.stopping)
        encoder = Encoder()
        while (message := self.outputs.get()) is not _SHUTDOWN:
            kind = (OutputKind.UTILITY_RESULT if isinstance(message, UtilityResult)
                    else OutputKind.OUTPUTS)
            frames = encoder.encode(kind, message)
            socket.send_multipart(split_payload(frames, TCP_FRAME_BYTES) if self.endpoint.is_tcp
                                  else frames, copy=False)
        if self.endpoint.is_tcp:
            socket.disable_monitor()  # its watch thread closes the monitor and ends
        socket.close()


def _start_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """A daemon thread whose failure ends the process: a dead I/O thread would otherwise
    leave a core that silently never answers, which the front end cannot detect."""

    def run() -> None:
        try:
            target()
        except BaseException:
            logger.critical("engine core %s thread failed:\n%s", name, traceback.format_exc())
            os._exit(1)

    thread = threading.Thread(target=run, name=f"EngineCore-{name}", daemon=True)
    thread.start()
    return thread


def _exit_when_disconnected(socket: zmq.Socket, address: str,
                            stopping: threading.Event) -> None:
    """A headless node's core (TCP): exit once the front end is gone - its connection
    closed, or its heartbeats stopped - since no one is left to serve."""
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                                        | zmq.EVENT_MONITOR_STOPPED)

    def watch() -> None:
        connected = False
        while True:
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_MONITOR_STOPPED:  # the socket is closing
                monitor.close(linger=0)
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
            elif event == zmq.EVENT_DISCONNECTED and connected and not stopping.is_set():
                logger.critical("the front end at %s is gone; this engine stops", address)
                os._exit(1)

    threading.Thread(target=watch, name="EngineCore-front-end-watch", daemon=True).start()


def _exit_on_worker_death(reason: str) -> None:
    """A worker process died: no step can run again, so the core exits at once (its other
    workers were stopped), and the front end fails every request with the engine dead."""
    logger.critical("engine core stops: %s", reason)
    os._exit(1)


def _exit_with_parent(endpoint: CoreEndpoint) -> None:
    """Exit as soon as the parent process is gone (its sentinel pipe closes), however it
    died - even by SIGKILL, where it had no chance to stop us, nor to remove the sockets'
    directory."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        endpoint.remove_directory()
        os._exit(1)

    threading.Thread(target=watch, name="EngineCore-parent-watch", daemon=True).start()


def run_engine_core(config: EngineConfig, endpoint: CoreEndpoint,
                    ready_pipe: multiprocessing.connection.Connection) -> None:
    """The core process's entry point."""
    # A terminal (Ctrl-C) or a service manager (SIGTERM) signals the whole process group.
    # The server then drains its requests and stops us itself; dying first would fail them.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _exit_with_parent(endpoint)
    from octavo.models.loader import ModelLoadError

    try:
        proc = EngineCoreProc(config, endpoint)
    except (ModelLoadError, ConfigError, PlatformError) as exc:
        ready_pipe.send(str(exc))
        os._exit(1)
    except BaseException as exc:
        logger.critical("engine core failed to start:\n%s", traceback.format_exc())
        ready_pipe.send(f"engine core failed to start: {type(exc).__name__}: {exc}")
        os._exit(1)
    ready_pipe.send(proc.ready)
    ready_pipe.close()
    try:
        proc.run_busy_loop()
        proc.shutdown()
    except BaseException:
        logger.critical("engine core failed:\n%s", traceback.format_exc())
        os._exit(1)


def start_engine_core_process(config: EngineConfig, endpoint: CoreEndpoint,
                              ) -> tuple[BaseProcess, multiprocessing.connection.Connection]:
    """Spawn the core process (spawn, not fork: the parent may hold threads and an event
    loop); returns it and the pipe its handshake arrives on. ``endpoint`` (the CURVE keys
    with it) travels in the spawn arguments, which only the child reads."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    proc = context.Process(target=run_engine_core, name="EngineCore", daemon=True,
                           args=(config, endpoint, sender))
    proc.start()
    sender.close()  # the child holds it now; EOF on ours means the child is gone
    return proc, receiver


def read_handshake(proc: BaseProcess, pipe: multiprocessing.connection.Connection) -> EngineReady:
    """Read the handshake; call it once ``pipe`` is readable (a message, or EOF because the
    process died before sending one)."""
    try:
        message = pipe.recv()
    except EOFError:
        proc.join()
        raise EngineStartError(f"the engine core process exited with code {proc.exitcode} "
                               "before it was ready") from None
    if isinstance(message, EngineReady):
        return message
    proc.join()
    raise EngineStartError(message)
