"""The hand-over latency of the executor's shared-memory queue (``octavo.executor.shm_queue``):
the median round trip of a message between 2 processes, ping-pong through a pair of queues
(this process writes the ping queue, an echo process the pong queue).

    .venv/bin/python benchmarks/shm_queue_latency.py                   # 2000 rounds of 1 KB
    .venv/bin/python benchmarks/shm_queue_latency.py --rounds 20 --size 65536
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from octavo.executor.shm_queue import MessageQueue, QueueHandle

WARMUP_ROUNDS = 50


def echo(ping: QueueHandle, socket_dir: Path, rounds: int, pong_handle: Connection) -> None:
    """The other process: send every ping back on a pong queue of its own."""
    with MessageQueue.attach(ping, 0) as pings, MessageQueue.create(1, socket_dir) as pongs:
        pong_handle.send(pongs.handle())
        for _ in range(rounds):
            pongs.enqueue(pings.dequeue(timeout_s=60))
        pong_handle.recv()  # the last pong is read before its queue goes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024, help="bytes a message")
    args = parser.parse_args()
    socket_dir = Path(tempfile.mkdtemp(prefix="octavo-shmq-"))
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    total = WARMUP_ROUNDS + args.rounds
    child = None
    try:
        with MessageQueue.create(1, socket_dir) as pings:
            child = context.Process(target=echo, args=(pings.handle(), socket_dir, total,
                                                       child_conn), daemon=True)
            child.start()
            if not conn.poll(60):
                raise RuntimeError("the echo process never sent its queue's handle")
            with MessageQueue.attach(conn.recv(), 0) as pongs:
                payload = os.urandom(args.size)
                round_trips = []
                for _ in range(total):
                    start = time.perf_counter()
                    pings.enqueue(payload)
                    if pongs.dequeue(timeout_s=60) != payload:
                        raise RuntimeError("the echo came back altered")
                    round_trips.append(time.perf_counter() - start)
                conn.send("done")
            child.join(timeout=60)
    finally:
        if child is not None and child.is_alive():
            child.kill()
        shutil.rmtree(socket_dir)
    median_us = statistics.median(round_trips[WARMUP_ROUNDS:]) * 1e6
    print(f"{args.rounds} round trips of {args.size} bytes: median {median_us:.1f} us")


if __name__ == "__main__":
    main()
