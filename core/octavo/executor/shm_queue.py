"""A broadcast queue of ``bytes`` from one writer to N reader processes over shared memory:
the executor writes each step's encoded ``SchedulerOutput`` once and every worker reads it
(a second queue, one reader, carries the answer back). vLLM V1's ``MessageQueue`` idea,
written for Octavo; payloads are opaque bytes (msgspec-encoded by the caller), never pickled.

The segment (C = ``num_chunks``, R = ``num_readers``)::

    [chunk 0 data] ... [chunk C-1 data]   chunk_bytes each: payloads, written in place
    [chunk 0 meta] ... [chunk C-1 meta]   8 + R bytes each, padded to a multiple of 8:
        length  int64    the payload's size, or OVERFLOW (-1): it went over the socket
        read    R bytes  reader r's flag; 1 = read, the writer may reuse the chunk

Protocol: the writer fills the chunks in ring order, every reader reads them in that order
with a cursor of its own. All flags start at 1. The writer waits until all R flags of its
next chunk are 1, writes the payload and its length, then publishes the chunk by clearing
the flags; reader r waits until its flag of its next chunk is 0, copies the payload out and
sets the flag back to 1. Clearing the flags is the one publication point, so there is no
"written" flag: a chunk never written reads as "read by all".

A payload longer than ``chunk_bytes`` goes over ZeroMQ, from the writer's XPUB at an
``ipc://`` path to a SUB in each reader; its chunk carries OVERFLOW and the reader takes
the next socket message. Both are in order, so order holds; the ring bounds the socket's
backlog to C messages, so its high-water mark (beyond which it drops) is off. ZeroMQ also
drops what is published before a subscription has reached the publisher (the slow joiner),
so each reader also subscribes to a topic naming it, and the writer sends nothing before
its XPUB has handed it all R.
"""

from __future__ import annotations

import os
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import zmq

from octavo.paths import MAX_SOCKET_PATH
from octavo.shm import attach_untracked, memory_fence

OVERFLOW = -1
_LENGTH = struct.Struct("<q")
_READER_TOPIC = b"\xffoctavo-shm-queue-reader-"
_SPIN_S = 50e-6  # spin this long before sleeping: a hand-over meanwhile costs microseconds
_FIRST_NAP_S = 50e-6
_MAX_NAP_S = 1e-3  # an idle waiter wakes at most 1000 times a second
_STOP_CHECK_S = 10e-3  # how often a waiter asks should_stop()

StopCheck = Callable[[], bool]


class QueueClosed(RuntimeError):
    """``should_stop()`` turned true while ``enqueue`` or ``dequeue`` waited."""


@dataclass(frozen=True)
class QueueHandle:
    """What a reader process needs to attach to a queue: plain and picklable."""

    shm_name: str
    num_readers: int
    num_chunks: int
    chunk_bytes: int
    overflow_address: str  # "ipc://..." of the writer's XPUB socket


def _wait_until(ready: Callable[[], bool], should_stop: StopCheck | None,
                deadline: float | None) -> None:
    """Return once ``ready()``: spin briefly, then sleep in naps doubling up to 1 ms, so an
    idle worker leaves its core alone. ``should_stop`` is asked every 10 ms at most (it
    raises ``QueueClosed``); past ``deadline`` (``time.monotonic``) ``TimeoutError``."""
    now = time.monotonic()
    spin_end = now + _SPIN_S
    while now < spin_end:
        if ready():
            return
        now = time.monotonic()
    nap, next_check = _FIRST_NAP_S, now + _STOP_CHECK_S
    while not ready():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError("nothing arrived on the shared-memory queue in time")
        if should_stop is not None and now >= next_check:
            if should_stop():
                raise QueueClosed("stopped while waiting on the shared-memory queue")
            next_check = now + _STOP_CHECK_S
        time.sleep(nap)
        nap = min(2 * nap, _MAX_NAP_S)


def _meta_bytes(num_readers: int) -> int:
    """A chunk's metadata: the length and the read flags, padded to 8 bytes."""
    return (_LENGTH.size + num_readers + 7) // 8 * 8


class MessageQueue:
    """One end of a queue: the writer (``create``) or reader ``reader_index`` (``attach``)."""

    def __init__(self, handle: QueueHandle, shm: shared_memory.SharedMemory,
                 context: zmq.Context, socket: zmq.Socket, reader_index: int | None) -> None:
        assert shm.buf is not None  # an open segment has its buffer
        self._handle = handle
        self._shm = shm
        self._buf = shm.buf
        self._meta_start = handle.num_chunks * handle.chunk_bytes
        self._meta_stride = _meta_bytes(handle.num_readers)
        self._context = context
        self._socket = socket
        self._reader_index = reader_index  # None: the writer
        self._cursor = 0  # the next chunk to write or read
        self._subscribed: set[int] = set()  # the writer's: readers whose subscription arrived
        self._all_read = b"\x01" * handle.num_readers
        self._none_read = bytes(handle.num_readers)
        self._closed = False

    @classmethod
    def create(cls, num_readers: int, socket_dir: Path, *, num_chunks: int = 8,
               chunk_bytes: int = 1 << 20) -> MessageQueue:
        """The writer's end: a fresh segment, and the overflow socket bound in
        ``socket_dir`` (a private 0700 directory the caller owns and removes)."""
        if min(num_readers, num_chunks, chunk_bytes) < 1:
            raise ValueError("num_readers, num_chunks and chunk_bytes must be positive")
        path = Path(socket_dir) / f"shm-queue-{secrets.token_hex(4)}.sock"
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise ValueError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
        size = num_chunks * (chunk_bytes + _meta_bytes(num_readers))
        shm = shared_memory.SharedMemory(create=True, size=size)
        context = zmq.Context()
        socket = context.socket(zmq.XPUB)
        handle = QueueHandle(shm.name, num_readers, num_chunks, chunk_bytes, f"ipc://{path}")
        queue = cls(handle, shm, context, socket, reader_index=None)
        try:
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.bind(handle.overflow_address)
        except BaseException:
            queue.close()
            raise
        for chunk in range(num_chunks):
            queue._buf[queue._flags(chunk)] = queue._all_read
        return queue

    @classmethod
    def attach(cls, handle: QueueHandle, reader_index: int) -> MessageQueue:
        """Reader ``reader_index``'s end, in its own process; it reads from the first
        payload on. Each index is attached once."""
        if not 0 <= reader_index < handle.num_readers:
            raise ValueError(f"reader_index {reader_index} not in [0, {handle.num_readers})")
        shm = attach_untracked(handle.shm_name)
        context = zmq.Context()
        socket = context.socket(zmq.SUB)
        queue = cls(handle, shm, context, socket, reader_index)
        try:
            socket.setsockopt(zmq.RCVHWM, 0)
            # A SUB sends its subscriptions in order: everything first, then the topic that
            # tells the writer that "everything" is in place.
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.setsockopt(zmq.SUBSCRIBE, _READER_TOPIC + str(reader_index).encode())
            socket.connect(handle.overflow_address)
        except BaseException:
            queue.close()
            raise
        return queue

    def handle(self) -> QueueHandle:
        return self._handle

    def enqueue(self, payload: bytes | memoryview, should_stop: StopCheck | None = None) -> None:
        """Write ``payload`` for every reader, waiting while the next chunk is unread by any."""
        if self._reader_index is not None:
            raise RuntimeError("a reader's end of the queue cannot enqueue")
        view = memoryview(payload).cast("B")
        chunk = self._cursor
        flags = self._flags(chunk)
        _wait_until(lambda: self._buf[flags] == self._all_read, should_stop, None)
        memory_fence()  # the readers' copies out of the chunk came before our overwrite
        if len(view) > self._handle.chunk_bytes:
            self._await_subscribers(should_stop)
            self._socket.send(view)
            length = OVERFLOW
        else:
            start = chunk * self._handle.chunk_bytes
            self._buf[start:start + len(view)] = view
            length = len(view)
        _LENGTH.pack_into(self._buf, self._length_offset(chunk), length)
        memory_fence()  # the payload and its length are in place before the flags publish them
        self._buf[flags] = self._none_read
        self._cursor = (chunk + 1) % self._handle.num_chunks

    def dequeue(self, should_stop: StopCheck | None = None,
                timeout_s: float | None = None) -> bytes:
        """The next payload, in the order written; waits for it."""
        if self._reader_index is None:
            raise RuntimeError("the writer's end of the queue cannot dequeue")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        chunk = self._cursor
        flag = self._length_offset(chunk) + _LENGTH.size + self._reader_index
        _wait_until(lambda: self._buf[flag] == 0, should_stop, deadline)
        memory_fence()  # the flag was cleared after the payload was written: read it after the flag
        (length,) = _LENGTH.unpack_from(self._buf, self._length_offset(chunk))
        if length == OVERFLOW:
            _wait_until(lambda: self._socket.poll(0) != 0, should_stop, deadline)
            payload = self._socket.recv()
        else:
            start = chunk * self._handle.chunk_bytes
            payload = bytes(self._buf[start:start + length])
        memory_fence()  # copied out before the writer may reuse the chunk
        self._buf[flag] = 1
        self._cursor = (chunk + 1) % self._handle.num_chunks
        return payload

    def close(self) -> None:
        """Detach; the writer also unlinks the segment and its socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._socket.close(linger=0)
        self._context.term()
        self._shm.close()
        if self._reader_index is None:
            self._shm.unlink()
            # libzmq leaves the ipc socket's file behind.
            Path(self._handle.overflow_address.removeprefix("ipc://")).unlink(missing_ok=True)

    def __enter__(self) -> MessageQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _length_offset(self, chunk: int) -> int:
        return self._meta_start + chunk * self._meta_stride

    def _flags(self, chunk: int) -> slice:
        start = self._length_offset(chunk) + _LENGTH.size
        return slice(start, start + self._handle.num_readers)

    def _await_subscribers(self, should_stop: StopCheck | None) -> None:
        """Wait until every reader's subscription has reached the XPUB, so that ZeroMQ
        delivers what overflows to readers that joined late too (once: readers stay)."""
        prefix = b"\x01" + _READER_TOPIC  # 1: subscribe
        while len(self._subscribed) < self._handle.num_readers:
            _wait_until(lambda: self._socket.poll(0) != 0, should_stop, None)
            message = self._socket.recv()
            if message.startswith(prefix):
                self._subscribed.add(int(message[len(prefix):]))
