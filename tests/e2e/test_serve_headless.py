"""A front end and a headless node, both on 127.0.0.1 (different ports stand for nodes):
``octavo serve -dp 2 --data-parallel-size-local 1`` waits for the engine of
``octavo serve --headless -dp 2 --data-parallel-size-local 1 --data-parallel-start-rank 1``.

Refused handshakes name their reason (a wrong secret; another model; a replayed Hello), a
rank whose claimant leaves before it is ready is free again, the pair serves the ``openai``
client with both engines - after peers without the secret poked every port the front end
listens on (garbage, ZMTP greetings, a 400 MB frame on each), which changed nothing and
cost the front end no memory - with no socket listening beyond loopback, and SIGKILLing the headless
node turns ``/health`` degraded within 5 s, failing (never hanging) the requests its engine
held.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import openai
import psutil
import pytest
import zmq
from openai import OpenAI

from octavo.config import EngineConfig
from octavo.engine.dp_handshake import (
    Challenge,
    Hello,
    Knock,
    Message,
    Refused,
    Welcome,
    engine_identity,
    new_nonce,
    seal,
    unseal,
)

from ..core.tiny_models import TinyModel, fresh_tiny_llama
from .conftest import TINY_SERVER_ARGS
from .server import (
    HOST,
    ONE_THREAD_ENV,
    Server,
    free_port,
    port_is_free,
    still_running,
    tcp_listeners,
    wildcard_listeners,
)
from .test_serve_data_parallel import requests_per_engine

SECRET = "a-shared-secret"
PROMPT = "Tell me a story"
HUGE_FRAME_BYTES = 400 << 20  # declared by a peer without the secret, and streamed
RSS_SLACK_BYTES = 50 << 20  # the front end's growth allowed meanwhile
# A ZMTP 3.0 greeting (signature, version, mechanism, as-server, filler): what a ZMQ peer
# sends first, so that what follows reaches the socket's decoder.
ZMTP_GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


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


def node_processes(node: HeadlessNode) -> list[psutil.Process]:
    parent = psutil.Process(node.proc.pid)
    return [parent, *parent.children(recursive=True)]


def join_socket(context: zmq.Context, rpc_port: int) -> zmq.Socket:
    """A connection to the front end's join port, as a headless node opens one."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://{HOST}:{rpc_port}")
    return dealer


def exchange(dealer: zmq.Socket, data: bytes, salt: str = "") -> Message:
    """Send one handshake frame; the front end's answer."""
    dealer.send(data)
    assert dealer.poll(10_000), "the front end did not answer"
    return unseal(dealer.recv(), SECRET.encode(), salt)


def signed_hello(dealer: zmq.Socket, identity: dict[str, str]) -> tuple[Hello, bytes]:
    """A valid Hello for rank 1, answering the challenge issued on ``dealer``."""
    challenge = exchange(dealer, seal(Knock(), b""))
    assert isinstance(challenge, Challenge), challenge
    hello = Hello(1, identity, challenge.nonce, new_nonce(), "a test with the secret")
    return hello, seal(hello, SECRET.encode(), challenge.nonce)


def poke(port: int, data: bytes) -> None:
    """Connect, send ``data`` and close, as a peer without the secret can."""
    with socket.create_connection((HOST, port), timeout=5) as peer:
        peer.sendall(data)
        time.sleep(0.05)


def poke_like_a_stranger(port: int) -> None:
    """What a peer without the secret can send: garbage, greetings, a bogus CURVE HELLO."""
    poke(port, b"GET / HTTP/1.0\r\n\r\n")
    poke(port, ZMTP_GREETING)
    poke(port, ZMTP_GREETING.replace(b"NULL", b"CURVE") + b"\x04\x05hello")


def stream_huge_frame(port: int, mechanism: bytes = b"NULL") -> int:
    """Declare a ``HUGE_FRAME_BYTES`` frame after a ZMTP greeting of ``mechanism`` (the
    socket's, so that the frame reaches its decoder) and stream it in 1 MiB writes (never
    held here) until the peer drops the connection; the bytes sent."""
    chunk, sent = bytes(1 << 20), 0
    with socket.create_connection((HOST, port), timeout=10) as peer:
        try:
            peer.sendall(ZMTP_GREETING.replace(b"NULL", mechanism))
            time.sleep(0.05)
            peer.sendall(b"\x06" + HUGE_FRAME_BYTES.to_bytes(8, "big"))  # a long command
            while sent < HUGE_FRAME_BYTES:
                sent += peer.send(chunk)
        except OSError:  # reset or broken pipe: dropped, as it must be
            pass
    return sent


def peak_rss_during(process: psutil.Process, action: Callable[[], object]) -> tuple[int, int]:
    """``process``'s RSS before ``action`` and its peak while it runs (sampled every 5 ms)."""
    before = peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        action()
        time.sleep(0.2)  # what the front end buffered by now would show
    finally:
        done.set()
        sampler.join()
    return before, peak


def test_strangers_and_a_replayed_hello_change_nothing_and_a_leaver_frees_its_rank(
        tiny_model: TinyModel, rpc_port: int, front_end: Server) -> None:
    """Before the real node joins (the tests after this one show that it does), with
    strangers' connections and a 400 MB frame on the join port first."""
    deadline = time.monotonic() + 120
    while port_is_free(rpc_port):  # the front end is still starting
        assert time.monotonic() < deadline and front_end.proc.poll() is None, front_end.log()
        time.sleep(0.1)
    poke_like_a_stranger(rpc_port)
    api = psutil.Process(front_end.proc.pid)
    before, peak = peak_rss_during(api, partial(stream_huge_frame, rpc_port))
    print(f"\na {HUGE_FRAME_BYTES >> 20} MiB frame on the join port: front end RSS "
          f"{before >> 20} MiB before, {peak >> 20} MiB at most")
    assert peak - before < RSS_SLACK_BYTES
    config = EngineConfig.from_kwargs(model=str(tiny_model.folder), dtype="float32",
                                      data_parallel_size=2)
    identity = engine_identity(config, tiny_model.folder)
    context = zmq.Context()
    try:
        claimant, replayer, latecomer = (join_socket(context, rpc_port) for _ in range(3))
        hello, sealed = signed_hello(claimant, identity)
        exchange(replayer, seal(Knock(), b""))  # its own challenge, which the copy ignores
        replayed = exchange(replayer, sealed)
        assert isinstance(replayed, Refused) and "a replayed handshake" in replayed.reason
        welcome = exchange(claimant, sealed, hello.nonce)  # on its own connection it joins
        assert isinstance(welcome, Welcome), welcome
        _, second_claim = signed_hello(latecomer, identity)
        taken = exchange(latecomer, second_claim)
        assert isinstance(taken, Refused) and "rank 1 has joined already" in taken.reason
        claimant.close(linger=0)  # leaves before Ready
        deadline = time.monotonic() + 10
        while "rank 1 is free again" not in front_end.log():
            assert time.monotonic() < deadline, front_end.log()
            time.sleep(0.05)
    finally:
        context.destroy(linger=0)


def test_front_end_and_headless_node_serve_the_openai_client(front_end: Server,
                                                             node: HeadlessNode,
                                                             rpc_port: int) -> None:
    listeners = tcp_listeners(front_end.processes() + node_processes(node))
    print(f"\nfront end and headless node listen on: {listeners}")
    assert wildcard_listeners(listeners) == [], listeners
    ports = [int(line.split()[0].rsplit(":", 1)[1]) for line in listeners]
    ports.remove(front_end.port)
    # Engine 1's two sockets; the join port closed once every engine had joined.
    assert len(ports) == 2 and rpc_port not in ports, listeners
    api = psutil.Process(front_end.proc.pid)
    for port in ports:  # peers without the secret: none of this may end engine 1
        poke_like_a_stranger(port)
        before, peak = peak_rss_during(api, partial(stream_huge_frame, port, b"CURVE"))
        print(f"a {HUGE_FRAME_BYTES >> 20} MiB frame on engine 1's port {port}: front end "
              f"RSS {before >> 20} MiB before, {peak >> 20} MiB at most")
        assert peak - before < RSS_SLACK_BYTES
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

    # Prompt logprobs of a 450-token prompt: about 110 KiB of outputs in one message, which
    # engine 1 sends as several 64 KiB frames; each engine's are the same.
    before = requests_per_engine(front_end)

    def prompt_logprobs(_: int) -> list:
        choice = client.completions.create(model=model, prompt=PROMPT * 30, max_tokens=1,
                                           temperature=0,
                                           extra_body={"prompt_logprobs": 20}).choices[0]
        return choice.model_extra["prompt_logprobs"]

    with ThreadPoolExecutor(4) as pool:
        logprobs = list(pool.map(prompt_logprobs, range(4)))
    after = requests_per_engine(front_end)
    assert after["1"] > before["1"], (before, after)
    assert len(logprobs[0]) == 450 and all(each == logprobs[0] for each in logprobs)


def test_killing_the_headless_node_degrades_health_and_fails_its_requests(
        front_end: Server, node: HeadlessNode) -> None:
    """Four streams over the two engines; the node is killed while its streams are in it.
    To be sure they still are (on the tiny model a stream ends in half a second), the node
    is stopped (SIGSTOP) before they are sent: each stream's headers come once its request
    is in an engine, and the node's can then neither run nor end."""
    client = OpenAI(base_url=f"{front_end.url}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    routed = threading.Barrier(5)  # four streams and this thread

    def long_stream(_: int) -> str | Exception:
        """The text streamed, or the error the stream ended with."""
        text = ""
        try:
            stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=480,
                                               stream=True, extra_body={"ignore_eos": True})
            routed.wait(30)
            for chunk in stream:
                text += chunk.choices[0].text
        except openai.APIError as exc:
            return exc
        return text

    os.killpg(node.proc.pid, signal.SIGSTOP)
    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(long_stream, i) for i in range(4)]
        routed.wait(30)  # every stream's request is in an engine
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
