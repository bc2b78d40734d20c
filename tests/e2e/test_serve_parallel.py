"""``octavo serve -tp 2``: a worker process per rank behind the real server, the official
``openai`` client (streaming included) getting the tokens one rank would give, with no
socket listening beyond loopback (``ss -ltnp``; torch's rendezvous store would listen on
every interface unless bound for it); and SIGKILL
of one worker mid-stream: the stream ends with an error, /health answers 503 within a
second, no Octavo process is left once the server has exited, and the dead engine core's
socket directory is removed by the new one's.

The worker is killed under ``--restart-engine``, so /health stays 503 while a new engine
core and its workers start (without it the server exits at once and /health may never be
seen answering); the engine core killed without it is the next test."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from octavo import LLM, SamplingParams

from .conftest import TINY_SERVER_ARGS, TinyModel
from .server import Server, still_running, tcp_listeners, wildcard_listeners
from .test_serve_faults import RawStream

PROMPT = "Tell me a story"


def start_tp2_server(model: TinyModel, tmp_path: Path, *args: str) -> Server:
    return Server(["--model", str(model.folder), *TINY_SERVER_ARGS, "-tp", "2", *args],
                  tmp_path / "server.log").wait_ready(timeout=240)


def worker_processes(server: Server) -> list[psutil.Process]:
    engine = psutil.Process(server.engine_pid())
    return [p for p in engine.children() if "octavo.executor.worker_proc" in " ".join(p.cmdline())]


def test_tp2_server_answers_the_openai_client(tiny_model: TinyModel, tmp_path: Path) -> None:
    reference_llm = LLM(str(tiny_model.folder), dtype="float32", kv_cache_memory=1 << 25)
    reference = reference_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16,
                                                              ignore_eos=True))[0].outputs[0]
    with start_tp2_server(tiny_model, tmp_path) as server:
        assert len(worker_processes(server)) == 2
        listeners = tcp_listeners(server.processes())
        workers = [f"pid={worker.pid}," for worker in worker_processes(server)]
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
        whole = client.completions.create(model=str(tiny_model.folder), prompt=PROMPT,
                                          max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
        streamed = "".join(
            chunk.choices[0].text for chunk in client.completions.create(
                model=str(tiny_model.folder), prompt=PROMPT, max_tokens=16, temperature=0,
                stream=True, extra_body={"ignore_eos": True}))
    assert whole.choices[0].text == reference.text, f"seed {tiny_model.seed}"
    assert streamed == reference.text
    print(f"\n-tp 2 listeners: {listeners}")
    assert wildcard_listeners(listeners) == [], listeners
    # The rendezvous store (rank 0) and gloo's sockets are among them, on loopback.
    assert all(any(pid in line for line in listeners) for pid in workers), listeners


@pytest.fixture
def socket_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime dir of the test's own (short: socket paths must fit), for the server's
    socket directories."""
    with tempfile.TemporaryDirectory(prefix="sd-", dir="/tmp") as base:
        monkeypatch.setenv("XDG_RUNTIME_DIR", base)
        yield Path(base)


def socket_dir_owners(base: Path) -> set[int]:
    """The pids that made the socket directories in ``base`` (octavo-<namespace>-<pid>-...)."""
    return {int(path.name.split("-")[2]) for path in base.iterdir()}


def test_worker_killed_mid_stream(tiny_model: TinyModel, tmp_path: Path,
                                  socket_base: Path) -> None:
    server = start_tp2_server(tiny_model, tmp_path, "--restart-engine")
    try:
        first_core = server.engine_pid()
        assert first_core in socket_dir_owners(socket_base)  # its executor's directory
        stream = RawStream(server, max_tokens=400, prompt=PROMPT)
        stream.read_event()
        victim = worker_processes(server)[1]
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        while server.request("GET", "/health")[0] != 503:
            assert time.monotonic() - killed < 5, "/health did not turn 503"
            time.sleep(0.02)
        unhealthy_s = time.monotonic() - killed
        stream.read_to_end()
        while server.request("GET", "/health")[0] != 200:  # a new core and new workers
            assert time.monotonic() - killed < 120, "the engine was not restarted"
            time.sleep(0.2)
        after = server.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
        owners = socket_dir_owners(socket_base)  # the dead core's is gone, the live ones stay
        live = {server.proc.pid, server.engine_pid()}
        everything = server.processes()
        assert len(worker_processes(server)) == 2
    finally:
        server.stop()
    print(f"\nworker {victim.pid} killed: /health 503 after {unhealthy_s * 1000:.0f} ms")
    assert unhealthy_s < 1.0
    assert stream.events[-1] == "[DONE]", stream.events[-3:]
    assert [e["code"] for e in stream.errors()] == ["engine_dead"], stream.events[-3:]
    assert after[0] == 200, after
    assert owners == live, (owners, live, first_core)
    assert not still_running(everything, timeout=10)


def test_engine_core_killed_leaves_no_worker(tiny_model: TinyModel, tmp_path: Path) -> None:
    """SIGKILL gives the engine core no chance to stop its workers: they see their pipe to
    it close and exit by themselves; the server exits, and nothing of its tree is left."""
    server = start_tp2_server(tiny_model, tmp_path)
    try:
        everything = server.processes()
        workers = worker_processes(server)
        assert len(workers) == 2
        os.kill(server.engine_pid(), signal.SIGKILL)
        left = still_running(workers, timeout=10)
        server.proc.wait(30)
    finally:
        server.stop()
    assert not left, [p.pid for p in left]
    assert server.proc.returncode == 1  # the server exits on its engine's death
    assert not still_running(everything, timeout=10)
