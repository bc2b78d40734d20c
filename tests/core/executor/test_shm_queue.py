"""The shared-memory broadcast queue (``octavo.executor.shm_queue``) between real processes:
every reader gets every payload in order and byte-identical, the overflow socket's among the
chunks' while the ring wraps; the writer never overwrites a chunk a reader has not read;
``should_stop`` and ``timeout_s`` end a wait; a reader's exit leaves the segment to the
writer, whose close leaves nothing behind."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import psutil
import pytest

from octavo.executor.shm_queue import MessageQueue, QueueClosed, QueueHandle
from octavo.testing.seeds import draw_seed

pytestmark = pytest.mark.timeout(180)

SPAWN = multiprocessing.get_context("spawn")
CHUNK = 4096
WAIT_S = 60.0  # the bound on any one wait for another process

# A reader in a process of its own, started by subprocess: it has its own resource tracker
# (children of a multiprocessing spawn share their parent's), the one that would unlink the
# segment at its exit. Prints the tracker's pid, then the digests of what it reads; exits
# without closing, as a crashed worker would.
_READER_SCRIPT = """
import hashlib, json, sys
from multiprocessing import resource_tracker
from octavo.executor.shm_queue import MessageQueue, QueueHandle
resource_tracker.ensure_running()
print(resource_tracker._resource_tracker._pid, flush=True)
queue = MessageQueue.attach(QueueHandle(**json.loads(sys.argv[1])), int(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    print(hashlib.sha256(queue.dequeue(timeout_s=60)).hexdigest(), flush=True)
"""


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _random_payloads(count: int) -> list[bytes]:
    """Random bytes of random sizes, a quarter past the chunk (overflow), with the edges.
    The first overflows: it is sent before any reader can have subscribed (a slow joiner)."""
    rng = random.Random(draw_seed())
    sizes = [0, 1, CHUNK, CHUNK + 1]
    sizes += [rng.randrange(CHUNK + 1, 5 * CHUNK) if rng.random() < 0.25
              else rng.randrange(CHUNK + 1) for _ in range(count - 1 - len(sizes))]
    rng.shuffle(sizes)
    return [os.urandom(size) for size in [rng.randrange(CHUNK + 1, 5 * CHUNK), *sizes]]


def _any_exited(processes: list[BaseProcess]) -> Callable[[], bool]:
    return lambda: any(process.exitcode is not None for process in processes)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A private directory for the overflow socket; it must be empty by the end."""
    directory = Path(tempfile.mkdtemp(prefix="octavo-shmq-"))
    yield directory
    leftovers = os.listdir(directory)
    shutil.rmtree(directory)
    assert leftovers == []


@pytest.fixture
def spawn() -> Iterator[Callable[..., BaseProcess]]:
    """Start spawned processes; any still running at the end of the test is killed."""
    started: list[BaseProcess] = []

    def start(target: Callable[..., None], *args: object) -> BaseProcess:
        process = SPAWN.Process(target=target, args=args, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.join(timeout=WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
        assert process.exitcode == 0


def _read_all(handle: QueueHandle, reader_index: int, count: int, results: Connection) -> None:
    with MessageQueue.attach(handle, reader_index) as queue:
        results.send([_digest(queue.dequeue(timeout_s=WAIT_S)) for _ in range(count)])


def test_every_reader_gets_every_payload_in_order(socket_dir, spawn):
    payloads = _random_payloads(200)
    assert sum(len(payload) > CHUNK for payload in payloads) > 10
    with MessageQueue.create(3, socket_dir, num_chunks=4, chunk_bytes=CHUNK) as queue:
        readers, results = [], []
        for index in range(3):
            receiver, sender = SPAWN.Pipe(duplex=False)
            readers.append(spawn(_read_all, queue.handle(), index, len(payloads), sender))
            results.append(receiver)
        for number, payload in enumerate(payloads):
            # Both kinds of payload: bytes, and a view the chunk is written from in place.
            queue.enqueue(payload if number % 2 else memoryview(payload),
                          should_stop=_any_exited(readers))
        for receiver in results:
            assert receiver.poll(WAIT_S)
            assert receiver.recv() == [_digest(payload) for payload in payloads]


def _read_when_told(handle: QueueHandle, conn: Connection) -> None:
    with MessageQueue.attach(handle, 0) as queue:
        conn.recv()
        conn.send([_digest(queue.dequeue(timeout_s=WAIT_S)) for _ in range(4)])
        conn.send(_digest(queue.dequeue(timeout_s=WAIT_S)))


def test_a_slow_reader_blocks_the_writer(socket_dir, spawn):
    """The ring is full of unread payloads: the next enqueue waits (until should_stop gives
    up) instead of overwriting the oldest, which the reader then gets first and intact."""
    payloads = [os.urandom(random.randrange(1, CHUNK + 1)) for _ in range(5)]
    with MessageQueue.create(1, socket_dir, num_chunks=4, chunk_bytes=CHUNK) as queue:
        conn, child_conn = SPAWN.Pipe()
        reader = spawn(_read_when_told, queue.handle(), child_conn)
        for payload in payloads[:4]:
            queue.enqueue(payload, should_stop=_any_exited([reader]))
        give_up = time.monotonic() + 0.3
        with pytest.raises(QueueClosed):
            queue.enqueue(payloads[4], should_stop=lambda: time.monotonic() > give_up)
        conn.send("read")
        assert conn.poll(WAIT_S)
        assert conn.recv() == [_digest(payload) for payload in payloads[:4]]
        queue.enqueue(payloads[4], should_stop=_any_exited([reader]))
        assert conn.poll(WAIT_S)
        assert conn.recv() == _digest(payloads[4])


@pytest.mark.timed
def test_should_stop_and_timeout_end_a_wait(socket_dir):
    with MessageQueue.create(1, socket_dir, num_chunks=2, chunk_bytes=CHUNK) as queue:
        # An overflow waits for every reader's subscription; none has attached yet.
        stop_at = time.monotonic() + 0.05
        with pytest.raises(QueueClosed):
            queue.enqueue(os.urandom(2 * CHUNK), should_stop=lambda: time.monotonic() > stop_at)
        with MessageQueue.attach(queue.handle(), 0) as reader:
            stop_at = time.monotonic() + 0.05
            with pytest.raises(QueueClosed):
                reader.dequeue(should_stop=lambda: time.monotonic() > stop_at)
            assert time.monotonic() - stop_at < 0.2  # should_stop is asked every 10 ms
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                reader.dequeue(timeout_s=0.05)
            assert time.monotonic() - start >= 0.05
            # Neither left a half-done step behind.
            payloads = [os.urandom(2 * CHUNK), os.urandom(CHUNK // 2)]
            for payload in payloads:
                queue.enqueue(payload)
            assert [reader.dequeue(timeout_s=WAIT_S) for _ in payloads] == payloads


def _run_reader(handle: QueueHandle, reader_index: int, count: int) -> tuple[int, list[str]]:
    """Run ``_READER_SCRIPT``; its resource tracker's pid and the digests it printed."""
    done = subprocess.run(
        [sys.executable, "-c", _READER_SCRIPT, json.dumps(dataclasses.asdict(handle)),
         str(reader_index), str(count)],
        capture_output=True, text=True, timeout=WAIT_S, check=True)
    tracker_pid, *digests = done.stdout.split()
    return int(tracker_pid), digests


def _wait_gone(pid: int) -> None:
    """Wait until the process ``pid`` (not our child) has exited."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} is still running")


def test_a_reader_exiting_leaves_the_segment_to_the_writer(socket_dir):
    payloads = [os.urandom(CHUNK // 2), os.urandom(CHUNK)]
    queue = MessageQueue.create(2, socket_dir, num_chunks=4, chunk_bytes=CHUNK)
    segment = Path("/dev/shm", queue.handle().shm_name)
    try:
        queue.enqueue(payloads[0])
        tracker_pid, digests = _run_reader(queue.handle(), 0, 1)
        assert digests == [_digest(payloads[0])]
        _wait_gone(tracker_pid)  # a tracker that held the segment would have unlinked it
        assert segment.exists()
        queue.enqueue(payloads[1])
        _, digests = _run_reader(queue.handle(), 1, 2)
        assert digests == [_digest(payload) for payload in payloads]
    finally:
        queue.close()
        queue.close()
    assert not segment.exists()
