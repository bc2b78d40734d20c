"""A front end and a headless node, both on 127.0.0.1 (different ports stand for nodes):
``octavo serve -dp 2 --data-parallel-size-local 1`` waits for the engine of
``octavo serve --headless -dp 2 --data-parallel-size-local 1 --data-parallel-start-rank 1``.

Refused handshakes name their reason (a wrong secret; another model), the pair serves the
``openai`` client with both engines, and SIGKILLing the headless node turns ``/health``
degraded within 5 s, failing (never hanging) the requests its engine held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import psutil
import pytest
from openai import OpenAI

from ..core.tiny_models import TinyModel, fresh_tiny_llama
from .conftest import TINY_SERVER_ARGS
from .server import ONE_THREAD_ENV, Server, free_port, still_running
from .test_serve_data_parallel import requests_per_engine

SECRET = "a-shared-secret"
PROMPT = "Tell me a story"


class HeadlessNode:
    """``octavo serve --headless`` in its own session, logging to a file."""

    def __init__(self, model: Path, rpc_port: int, log_path: Path, secret: str = SECRET,
                 *args: str) -> None:
        self.log_path = log_path
        command = [sys.executable, "-m", "octavo", "serve", "--headless", "--model", str(model),
                   *TINY_SERVER_ARGS, "-dp", "2", "--data-parallel-size-local", "1",
                   "--data-parallel-start-rank", "1", "--data-parallel-rpc-port",
                   str(rpc_port), *args]
        env = {**os.environ, **ONE_THREAD_ENV, "OCTAVO_DATA_PARALLEL_SECRET": secret}
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture(scope="module")
def rpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def front_end(tiny_model: TinyModel, rpc_port: int,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Started, not ready: it waits for the headless engine."""
    server = Server(["--model", str(tiny_model.folder), *TINY_SERVER_ARGS, "-dp", "2",
                     "--data-parallel-size-local", "1", "--data-parallel-rpc-port",
                     str(rpc_port), "--data-parallel-secret", SECRET],
                    tmp_path_factory.mktemp("front-end") / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def node(tiny_model: TinyModel, rpc_port: int, front_end: Server,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadlessNode]:
    """The headless node the front end accepts; the front end is ready with it."""
    node = HeadlessNode(tiny_model.folder, rpc_port,
                        tmp_path_factory.mktemp("node") / "node.log")
    try:
        front_end.wait_ready(timeout=240)
        yield node
    finally:
        node.kill()


def refused(node: HeadlessNode) -> str:
    """The refusal a node exits with."""
    assert node.proc.wait(120) == 1, node.log()
    return node.log()


def test_a_wrong_secret_is_refused(tiny_model: TinyModel, rpc_port: int, front_end: Server,
                                   tmp_path: Path) -> None:
    log = refused(HeadlessNode(tiny_model.folder, rpc_port, tmp_path / "node.log",
                               "another-secret"))
    assert "different --data-parallel-secret values" in log, log
    assert "different --data-parallel-secret values" in front_end.log()


def test_another_model_is_refused(rpc_port: int, front_end: Server, tmp_path: Path) -> None:
    other = fresh_tiny_llama(tmp_path / "other-model")
    log = refused(HeadlessNode(other.folder, rpc_port, tmp_path / "node.log"))
    assert "the engine's model or config differs from the front end's: model: " in log, log


def test_another_config_is_refused(tiny_model: TinyModel, rpc_port: int, front_end: Server,
                                   tmp_path: Path) -> None:
    log = refused(HeadlessNode(tiny_model.folder, rpc_port, tmp_path / "node.log", SECRET,
                               "--block-size", "32"))
    assert "block_size: front end '16', this engine '32'" in log, log


def test_front_end_and_headless_node_serve_the_openai_client(front_end: Server,
                                                             node: HeadlessNode) -> None:
    status, _, health = front_end.request("GET", "/health")
    assert status == 200 and health["status"] == "ok", health
    client = OpenAI(base_url=f"{front_end.url}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id

    def complete(_: int) -> str:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=16,
                                         temperature=0, extra_body={"ignore_eos": True},
                                         ).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(complete, range(8)))
    landed = requests_per_engine(front_end)
    print(f"\n8 requests: {landed} per engine")
    assert min(landed.values()) >= 2, landed  # both engines served
    assert len(set(texts)) == 1, texts  # the same greedy text from either engine


def test_killing_the_headless_node_degrades_health_and_fails_its_requests(
        front_end: Server, node: HeadlessNode) -> None:
    client = OpenAI(base_url=f"{front_end.url}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id

    started = threading.Barrier(5)  # four streams and this thread

    def long_stream(_: int) -> str | Exception:
        """The text streamed, or the error the stream ended with."""
        text = ""
        try:
            stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=480,
                                               stream=True, extra_body={"ignore_eos": True})
            for index, chunk in enumerate(stream):
                text += chunk.choices[0].text
                if index == 0:
                    started.wait(30)
        except openai.APIError as exc:
            return exc
        return text

    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(long_stream, i) for i in range(4)]
        started.wait(30)  # every stream has its first token
        node.kill()
        killed = time.monotonic()
        health: dict = {}
        while time.monotonic() - killed < 5:
            status, _, health = front_end.request("GET", "/health")
            if status == 503 or health.get("status") == "degraded":
                break
            time.sleep(0.05)
        degraded_s = time.monotonic() - killed
        results = [future.result(timeout=120) for future in running]
    print(f"\nheadless node killed: /health {health.get('status')} after "
          f"{degraded_s * 1000:.0f} ms; results: {[type(r).__name__ for r in results]}")
    assert health.get("status") == "degraded", health
    assert [engine["alive"] for engine in health["engines"]] == [True, False]
    failed = [r for r in results if isinstance(r, Exception)]
    assert failed and len(failed) < 4, results  # engine 1's streams failed, engine 0's not
    # Each ended with the error event the server sends, not a broken connection.
    assert all(isinstance(r, openai.APIError) and not isinstance(r, openai.APIConnectionError)
               and "data-parallel engine 1 died" in str(r) for r in failed), failed
    text = client.completions.create(model=model, prompt=PROMPT, max_tokens=4).choices[0].text
    assert isinstance(text, str)


def test_without_a_secret_the_front_end_does_not_start(tiny_model: TinyModel,
                                                       tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key != "OCTAVO_DATA_PARALLEL_SECRET"}
    result = subprocess.run(
        [sys.executable, "-m", "octavo", "serve", "--model", str(tiny_model.folder), "-dp", "2",
         "--data-parallel-size-local", "1"], capture_output=True, text=True, env=env,
        timeout=60)
    assert result.returncode == 2, result.stderr
    assert "give --data-parallel-secret (or set OCTAVO_DATA_PARALLEL_SECRET)" in result.stderr


def test_the_node_exits_when_the_front_end_vanishes(tiny_model: TinyModel,
                                                    tmp_path: Path) -> None:
    """SIGKILL leaves the front end no chance to stop the node's engines: they notice the
    connection's end and exit, and so does the node (code 1), leaving no process."""
    port = free_port()
    front_end = Server(["--model", str(tiny_model.folder), *TINY_SERVER_ARGS, "-dp", "2",
                        "--data-parallel-size-local", "1", "--data-parallel-rpc-port",
                        str(port), "--data-parallel-secret", SECRET], tmp_path / "server.log")
    node = HeadlessNode(tiny_model.folder, port, tmp_path / "node.log")
    try:
        front_end.wait_ready(timeout=240)
        engines = psutil.Process(node.proc.pid).children(recursive=True)
        os.killpg(front_end.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        code = node.proc.wait(30)
        exited_s = time.monotonic() - killed
    finally:
        front_end.stop()
        node.kill()
    print(f"\nfront end killed: the headless node exited with {code} after {exited_s:.1f} s")
    assert code == 1, node.log()
    assert "the front end at tcp://127.0.0.1:" in node.log() and "is gone" in node.log()
    assert exited_s < 10
    assert still_running(engines, timeout=5) == []
