"""A real ``octavo serve`` subprocess for end-to-end tests, and plain HTTP calls to it.

The server runs in its own session (process group), logging to a file; ``stop()`` ends it
with SIGTERM and, should that fail, SIGKILLs the whole group, so no test leaves processes
behind even when it fails.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from octavo.net import free_port

HOST = "127.0.0.1"
API_KEY = "test-key"
# One compute thread per process: on a shared machine, torch's threads contending for busy
# cores make these small models tens of times slower.
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1"}
READY_TIMEOUT_S = 180  # launch to healthy, on a loaded 2-core machine



def port_is_free(port: int) -> bool:
    """Whether a new server could listen on ``port`` (SO_REUSEADDR, as servers set: closed
    connections lingering in TIME_WAIT do not hold a port, a listening socket does)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            sock.listen()
        except OSError:
            return False
        return True


class Server:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        command = [sys.executable, "-m", "octavo", "serve", "--host", HOST,
                   "--port", str(self.port), *args]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **ONE_THREAD_ENV})
        self.start_time = time.monotonic()
        self.ready_s: float | None = None  # seconds from launch to healthy

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> Server:
        """The server once healthy (``with Server(...) as server``); stopped on leaving the
        block, and at once if it never gets healthy."""
        try:
            return self.wait_ready(timeout=READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"octavo serve exited with {self.proc.returncode}:\n"
                                     f"{self.log()[-3000:]}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    self.ready_s = time.monotonic() - self.start_time
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"octavo serve not healthy after {timeout}s:\n{self.log()[-3000:]}")

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None, api_key: str | None = None,
                content_type: str | None = "application/json",
                ) -> tuple[int, dict[str, str], Any]:
        """(status, headers with lower-case names, JSON body or text). ``body`` bytes are
        sent as they are; ``content_type=None`` sends exactly ``headers`` (http.client adds
        Host unless given, and Content-Length)."""
        headers = {**({"Content-Type": content_type} if content_type else {}),
                   **(headers or {})}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        connection = http.client.HTTPConnection(HOST, self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read().decode()
            try:
                payload: Any = json.loads(raw)
            except json.JSONDecodeError:
                payload = raw
            return response.status, {k.lower(): v for k, v in response.getheaders()}, payload
        finally:
            connection.close()

    def metrics(self) -> dict[str, float]:
        """Sample name -> value of the server's Prometheus metrics."""
        status, _, text = self.request("GET", "/metrics")
        assert status == 200, text
        return {sample.name: sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples
                if not sample.name.endswith("_bucket")}

    def engine_pid(self) -> int:
        status, _, body = self.request("GET", "/version")
        assert status == 200, body
        return int(body["engine_pid"])

    def processes(self) -> list[psutil.Process]:
        """The server and everything it started."""
        parent = psutil.Process(self.proc.pid)
        return [parent, *parent.children(recursive=True)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in its group
        except ProcessLookupError:
            pass
        self.proc.wait()


def still_running(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``timeout`` s (zombies count as
    ended: they hold nothing but a pid until their new parent reaps them)."""
    deadline = time.monotonic() + timeout
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class HealthPoller:
    """``GET /health`` every 20 ms on a thread, each on a new connection (as a load balancer
    probes), until stopped: the status and time of every answer."""

    def __init__(self, server: Server, interval_s: float = 0.02) -> None:
        self.server = server
        self.interval_s = interval_s
        self.answers: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _poll(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            start = time.monotonic()
            connection = http.client.HTTPConnection(HOST, self.server.port, timeout=10)
            try:
                connection.request("GET", "/health")
                status = connection.getresponse().status
            except OSError:
                status = 0
            finally:
                connection.close()
            self.answers.append((status, time.monotonic() - start))
            self._stop.wait(self.interval_s)


WILDCARD_HOSTS = ("0.0.0.0", "*", "[::]", "::", "[::ffff:0.0.0.0]")


def tcp_listeners(processes: list[psutil.Process]) -> list[str]:
    """The listening TCP sockets of ``processes``, as ``ss -ltnp`` prints them (address,
    port, owner), so a failure shows the whole line."""
    pids = {process.pid for process in processes}
    table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [" ".join(line.split()[3:]) for line in table.splitlines()
            if pids & {int(pid) for pid in re.findall(r"pid=(\d+)", line)}]


def wildcard_listeners(listeners: list[str]) -> list[str]:
    """Those of ``tcp_listeners`` on every interface (0.0.0.0, ::, *)."""
    return [line for line in listeners if line.split()[0].rsplit(":", 1)[0] in WILDCARD_HOSTS]
