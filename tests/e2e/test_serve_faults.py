"""Faults the server must make visible and final: the engine core killed
(streams end with an error; the server exits non-zero, or restarts the engine with
--restart-engine) and SIGTERM during a stream (an error event and [DONE] once the
shutdown timeout is up; a short request finishes normally meanwhile)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from .conftest import TinyModel, start_tiny_server
from .server import HOST, Server

SHUTDOWN_TIMEOUT_S = 2.0


class RawStream:
    """One streaming completion read line by line off the socket, so a test sees exactly
    how it ends: its events, [DONE], and whether the chunked body was closed properly."""

    def __init__(self, server: Server, max_tokens: int, prompt: str = "Tell me a story") -> None:
        self.connection = http.client.HTTPConnection(HOST, server.port, timeout=60)
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        self.connection.request("POST", "/v1/completions", json.dumps(body),
                                {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.events: list[str] = []
        self.complete = False  # the chunked body ended with its terminating chunk

    def read_event(self) -> str:
        while line := self.response.readline().decode():
            if line.startswith("data: "):
                self.events.append(line[6:].strip())
                return self.events[-1]
        raise EOFError("the stream ended")

    def read_to_end(self) -> None:
        try:
            while self.read_event() != "[DONE]":
                pass
            self.complete = self.response.read().strip() == b""  # raises if chunking was cut
        except (EOFError, http.client.IncompleteRead, ConnectionError):
            self.complete = False
        finally:
            self.connection.close()

    def errors(self) -> list[dict]:
        return [json.loads(e)["error"] for e in self.events if e.startswith('{"error"')]


def kill_engine(server: Server) -> tuple[int, float]:
    pid = server.engine_pid()
    os.kill(pid, signal.SIGKILL)
    return pid, time.monotonic()


def test_engine_death_ends_streams_and_exits_non_zero(tiny_model: TinyModel,
                                                      tmp_path: Path) -> None:
    server = start_tiny_server(tiny_model, tmp_path).wait_ready(timeout=180)
    try:
        streams = [RawStream(server, max_tokens=400) for _ in range(3)]
        for stream in streams:
            stream.read_event()  # all running
        _, killed = kill_engine(server)
        for stream in streams:
            stream.read_to_end()
        server.proc.wait(10)
        exited_s = time.monotonic() - killed
    finally:
        server.stop()
    print(f"\nengine killed: the server exited with {server.proc.returncode} after "
          f"{exited_s:.2f} s")
    for stream in streams:
        assert stream.events[-1] == "[DONE]" and stream.complete, stream.events[-3:]
        assert [e["code"] for e in stream.errors()] == ["engine_dead"], stream.events[-3:]
    assert server.proc.returncode == 1
    assert exited_s < 5.0
    assert "the engine core died" in server.log()


def test_restart_engine_serves_again(tiny_model: TinyModel, tmp_path: Path) -> None:
    server = start_tiny_server(tiny_model, tmp_path, "--restart-engine").wait_ready(180)
    try:
        stream = RawStream(server, max_tokens=400)
        stream.read_event()
        old_pid, killed = kill_engine(server)
        stream.read_to_end()
        status, _, body = server.request("GET", "/health")
        version = server.request("GET", "/version")[2]
        gauges = server.metrics()
        while server.request("GET", "/health")[0] != 200:
            assert time.monotonic() - killed < 30, "the engine was not restarted in 30 s"
            assert server.proc.poll() is None, server.log()[-2000:]
            time.sleep(0.2)
        restarted_s = time.monotonic() - killed
        after = server.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3})
        new_pid = server.engine_pid()
    finally:
        server.stop()
    print(f"\nengine killed and restarted: serving again after {restarted_s:.1f} s")
    assert stream.errors() and stream.events[-1] == "[DONE]", stream.events[-3:]
    assert status == 503 and body["error"]["code"] == "engine_dead", body
    assert version["engine_pid"] is None and version["engine_running"] is False, version
    assert gauges["vllm:num_requests_running"] == 0, gauges
    assert gauges["vllm:kv_cache_usage_perc"] == 0, gauges
    assert after[0] == 200 and after[2]["usage"]["completion_tokens"] == 3, after
    assert new_pid != old_pid


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_ends_long_streams_with_an_error_and_done(tmp_path: Path,
                                                             signum: signal.Signals) -> None:
    # The default model: slow enough on a CPU that 1,000 tokens outlast the timeout.
    server = Server(["--max-model-len", "2048", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
                    tmp_path / "server.log").wait_ready(180)
    try:
        long = RawStream(server, max_tokens=1000)
        short = RawStream(server, max_tokens=3)
        long.read_event()
        server.proc.send_signal(signum)
        stopped = time.monotonic()
        readers = [threading.Thread(target=s.read_to_end) for s in (long, short)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
        long_ended_s = time.monotonic() - stopped
        server.proc.wait(SHUTDOWN_TIMEOUT_S + 10)
        exited_s = time.monotonic() - stopped
    finally:
        server.stop()
    print(f"\n{signal.Signals(signum).name}: the long stream ended after {long_ended_s:.2f} s "
          f"with {len(long.events)} events; the server exited after {exited_s:.2f} s")
    assert short.complete and not short.errors(), short.events[-3:]
    assert long.complete and long.events[-1] == "[DONE]", long.events[-3:]
    assert [e["code"] for e in long.errors()] == ["engine_dead"], long.events[-3:]
    assert SHUTDOWN_TIMEOUT_S - 0.5 <= long_ended_s < SHUTDOWN_TIMEOUT_S + 3
    # uvicorn re-raises the stop signal once it has shut down, as a killed process would end
    assert server.proc.returncode in (0, -signum, 1 if signum == signal.SIGINT else 0)
