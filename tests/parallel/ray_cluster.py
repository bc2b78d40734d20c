"""A local Ray cluster for the tests and benchmarks: raylets on 127.0.0.1, inside a network
namespace that has only loopback.

Ray replaces 127.0.0.1 with the machine's interface address even when told
``--node-ip-address 127.0.0.1`` (ray-project/ray#26293), and traffic here must stay on
loopback, so Ray only ever runs inside ``unshare --net`` with ``lo`` up (as root): the
driver too, so a test runs its whole Ray side as one command there
(``run_in_loopback_namespace``). The namespace has its own PIDs and ``/proc`` as well:
``ray stop --force`` inside sees, and kills, only this cluster's processes (not another
cluster on the machine), and when the command ends, however it ends (a timeout's SIGKILL
included), the kernel kills every process left in the namespace: no raylet outlives a run.

Inside, ``private_ray_tmpdir()`` gives Ray a temporary folder of its own (where ``ray.init
(address="auto")`` looks for the cluster ``ray start`` made), and ``local_ray_cluster(n,
cpus)`` starts a head and ``n - 1`` more raylets (each "node" on its own ports), waits until
all are alive, and stops them all afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "  # the line a run in the namespace reports on (JSON)
HEAD_PORT = 6379
AGENT_PORT = 52365  # each raylet's dashboard agent listens on its own port from here
OBJECT_STORE_BYTES = 100 << 20  # per raylet: the tests move only small objects
RAY_COMMAND_TIMEOUT_S = 60.0
NODES_TIMEOUT_S = 30.0
RAY = str(Path(sys.executable).parent / "ray")
# sh stays the namespace's first process (it reaps the daemons `ray start` leaves to it).
_NAMESPACE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc",
              "sh", "-c", 'ip link set lo up && "$@"', "sh"]


@dataclass
class ClusterUp:
    seconds: float  # from the first `ray start` to every node alive
    node_ids: list[str]


def loopback_namespace_unavailable() -> str | None:
    """Why a loopback-only namespace cannot be made here (not root, ...), or None."""
    try:
        probe = subprocess.run([*_NAMESPACE, "true"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if probe.returncode == 0 else probe.stderr.strip() or f"exit {probe.returncode}"


def run_in_loopback_namespace(argv: list[str], timeout_s: float,
                              cwd: Path | None = None) -> dict[str, Any]:
    """Run ``argv`` in a fresh network (loopback only), PID and mount namespace and return
    what it ``report``-ed; killed, with everything it started, after ``timeout_s``
    (``subprocess.TimeoutExpired``). ``RuntimeError`` with its stderr when it reported
    nothing."""
    done = subprocess.run([*_NAMESPACE, *argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}, reporting "
                           f"{'nothing' if not lines else 'something'}:\n"
                           f"{done.stderr[-6000:]}")
    return dict(json.loads(lines[-1][len(RESULT_PREFIX):]))


def report(results: dict[str, Any]) -> None:
    """Hand ``results`` to ``run_in_loopback_namespace`` outside (one line of stdout)."""
    print(RESULT_PREFIX + json.dumps(results), flush=True)


def only_loopback() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@contextmanager
def private_ray_tmpdir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths must fit
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(folder)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_ray_cluster(num_nodes: int, cpus_per_node: int) -> Iterator[ClusterUp]:
    """A head and ``num_nodes - 1`` more raylets on 127.0.0.1, ``cpus_per_node`` CPUs each;
    ``ray stop --force`` afterwards, whatever happened. Refuses to run outside a
    loopback-only network namespace."""
    if not only_loopback():
        raise RuntimeError("refusing to start Ray: this network namespace has interfaces "
                           "other than loopback (run inside run_in_loopback_namespace)")
    start = time.monotonic()
    try:
        _ray_start("--head", f"--port={HEAD_PORT}", "--include-dashboard=false",
                   f"--dashboard-agent-listen-port={AGENT_PORT}", cpus=cpus_per_node)
        for node in range(1, num_nodes):
            _ray_start(f"--address=127.0.0.1:{HEAD_PORT}",
                       f"--dashboard-agent-listen-port={AGENT_PORT + node}",
                       cpus=cpus_per_node)
        node_ids = _wait_for_nodes(num_nodes)
        yield ClusterUp(seconds=time.monotonic() - start, node_ids=node_ids)
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True,
                       timeout=RAY_COMMAND_TIMEOUT_S)


def _ray_start(*args: str, cpus: int) -> None:
    done = subprocess.run([RAY, "start", *args, f"--num-cpus={cpus}",
                           "--node-ip-address=127.0.0.1",
                           f"--object-store-memory={OBJECT_STORE_BYTES}",
                           "--disable-usage-stats"],
                          capture_output=True, text=True, timeout=RAY_COMMAND_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")


def _wait_for_nodes(count: int) -> list[str]:
    """The ids of the cluster's nodes once ``count`` are alive (a driver joins to look)."""
    import ray

    ray.init(address="auto")
    try:
        deadline = time.monotonic() + NODES_TIMEOUT_S
        while True:
            alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
            if len(alive) >= count:
                return alive
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(alive)} of {count} Ray nodes alive after "
                                   f"{NODES_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
    finally:
        ray.shutdown()
