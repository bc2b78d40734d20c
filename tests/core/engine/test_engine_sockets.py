"""The engine's sockets are private (probe finding D6): an ``AsyncLLM`` on a tiny random
model, and real local processes (``engine_intruder.py``) that connect to its ``ipc://``
sockets. One that reads the input socket gets none of the requests, which all complete;
one that pushes garbage into the output socket cannot make the engine look dead. A
request the core cannot decode is refused, not left waiting. Neither process listens on
TCP, and the socket directory is private and gone after shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from octavo import SamplingParams
from octavo.config import EngineConfig
from octavo.engine.errors import EngineStartError, InvalidRequestError
from octavo.engine.ipc import MAX_SOCKET_PATH, SOCKET_DIR_PREFIX, CoreEndpoint, make_socket_dir
from octavo.paths import pid_namespace
from octavo.testing.seeds import draw_seed
from tests.core.loop_engine import LoopEngine, start_async_llm
from tests.core.tiny_models import save_tiny_model
from tests.helpers import Records

ENGINE_ARGS = dict(dtype="float32", kv_cache_memory=8 * 2**20)
INTRUDER = Path(__file__).with_name("engine_intruder.py")
EAVESDROP_S = 4.0  # how long a reader stays connected, the requests running meanwhile
INJECT_S = 1.0  # how long a writer stays connected after sending
NUM_REQUESTS = 6
MAX_TOKENS = 8


class Served(LoopEngine):
    """An ``AsyncLLM`` whose socket directory is under a runtime dir of its own, and the TCP
    listeners this process had before it started."""

    def __init__(self, folder: Path, runtime_dir: Path) -> None:
        self.runtime_dir = runtime_dir
        self.listeners_before = tcp_listeners(psutil.Process())
        super().__init__(engine_config(folder), XDG_RUNTIME_DIR=str(runtime_dir))
        self.endpoint: CoreEndpoint = self.engine.client.sockets.core
        self.directory = self.engine.client.sockets.directory


def engine_config(folder: Path) -> EngineConfig:
    return EngineConfig.from_kwargs(model=str(folder), **ENGINE_ARGS)


def tcp_listeners(process: psutil.Process) -> list[Any]:
    return [c for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-sockets")
    save_tiny_model("llama", folder, seed=draw_seed())
    return folder


@pytest.fixture(scope="module")
def served(model_folder: Path, tmp_path_factory: pytest.TempPathFactory,
           single_thread: None) -> Iterator[Served]:
    served = Served(model_folder, tmp_path_factory.mktemp("runtime"))
    try:
        yield served
    finally:
        served.close()


def intrude(served: Served, mode: str, address: str, seconds: float,
            credentials: str) -> subprocess.Popen[str]:
    """Start an intruder and return once it is connected; the keys go through its stdin."""
    proc = subprocess.Popen([sys.executable, str(INTRUDER), mode, address, str(seconds),
                             credentials], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    keys = {"server_public_key": served.endpoint.server_public_key.decode(),
            "public_key": served.endpoint.public_key.decode(),
            "secret_key": served.endpoint.secret_key.decode()}
    proc.stdin.write(json.dumps(keys) + "\n")
    proc.stdin.close()
    readable, _, _ = select.select([proc.stdout], [], [], 60)
    if not readable or proc.stdout.readline().strip() != "ready":
        proc.kill()
        pytest.fail("the intruder did not connect")
    return proc


def report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.wait(timeout=EAVESDROP_S + 30) == 0  # its stdout is one short line: no deadlock
    assert proc.stdout is not None
    return json.loads(proc.stdout.read().strip().splitlines()[-1])  # type: ignore[no-any-return]


def serve_requests(served: Served, tag: str) -> list[int]:
    """NUM_REQUESTS concurrent requests, each within a deadline; their token counts."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    async def one(i: int) -> int:
        outputs = [out async for out in served.engine.generate(
            {"prompt_token_ids": [3, 1, 4, 1, 5, i]}, params, f"{tag}-{i}")]
        assert outputs[-1].finished
        return len(outputs[-1].outputs[0].token_ids)

    async def all_of_them() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*map(one, range(NUM_REQUESTS))), 60)

    return served.run(all_of_them())  # type: ignore[no-any-return]


def test_the_socket_directory_is_private(served: Served) -> None:
    info = served.directory.stat()
    assert served.directory.parent == served.runtime_dir
    assert served.directory.name.startswith(SOCKET_DIR_PREFIX)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert served.endpoint.input_address == f"ipc://{served.directory / 'input'}"
    assert served.endpoint.output_address == f"ipc://{served.directory / 'output'}"
    for path in served.directory.iterdir():
        assert stat.S_ISSOCK(path.stat().st_mode), path
    assert served.endpoint.secret_key.decode() not in repr(served.endpoint)


def test_no_process_listens_on_tcp(served: Served) -> None:
    assert tcp_listeners(psutil.Process()) == served.listeners_before
    assert tcp_listeners(psutil.Process(served.engine.client.proc.pid)) == []


@pytest.mark.parametrize("credentials", ["none", "stranger"])
def test_a_local_reader_of_the_input_socket_gets_nothing(served: Served,
                                                         credentials: str) -> None:
    """Before: a PULL on the input port took a round-robin share of live requests."""
    intruder = intrude(served, "eavesdrop", served.endpoint.input_address, EAVESDROP_S,
                       credentials)
    try:
        assert serve_requests(served, f"eavesdrop-{credentials}") == [MAX_TOKENS] * NUM_REQUESTS
        assert intruder.poll() is None, "the requests ran after the intruder had left"
    finally:
        result = report(intruder)
    assert result["received"] == 0
    assert result["events"] and "HANDSHAKE_SUCCEEDED" not in result["events"], result
    if credentials == "stranger":  # the right server key, but a client key not allowed
        assert "HANDSHAKE_FAILED_AUTH" in result["events"], result


@pytest.mark.parametrize("credentials", ["none", "stranger", "core"])
def test_garbage_pushed_into_the_output_socket_does_no_harm(served: Served,
                                                            credentials: str) -> None:
    """Before: one malformed frame on the output port made the API declare the engine dead.
    Strangers are not let in; the core's own key is (a stand-in for a frame corrupted on
    the way), and then each bad frame is dropped with at most one warning per 10 s."""
    handler = Records()
    drop_log = logging.getLogger("octavo.engine.serial.dropped")
    drop_log.addHandler(handler)
    try:
        result = report(intrude(served, "inject", served.endpoint.output_address, INJECT_S,
                                credentials))
        served.engine.check_health()
        assert serve_requests(served, f"inject-{credentials}") == [MAX_TOKENS] * NUM_REQUESTS
    finally:
        drop_log.removeHandler(handler)
    served.engine.check_health()
    if credentials == "core":
        assert result["events"] == ["HANDSHAKE_SUCCEEDED"] and result["sent"] > 0, result
        messages = [record.getMessage() for record in handler.records]
        assert len(messages) == 1 and "output message" in messages[0], messages
    else:
        assert "HANDSHAKE_SUCCEEDED" not in result["events"], result
        assert handler.records == []


def test_a_request_the_core_cannot_decode_is_refused_not_left_waiting(served: Served) -> None:
    """A message the core drops would leave its client waiting forever (and counted as
    waiting); one that names its request is refused instead (here: a bool where the core
    wants an int, which msgspec encodes but will not decode as one)."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    params.seed = True  # type: ignore[assignment]

    async def outcome() -> Any:
        stream = served.engine.generate({"prompt_token_ids": [1, 2]}, params, "undecodable")
        try:
            return await asyncio.wait_for(anext(stream), 30)
        except InvalidRequestError as exc:
            return exc

    error = served.run(outcome())
    assert isinstance(error, InvalidRequestError), error
    assert "sampling_params.seed" in str(error)
    assert served.engine.num_unfinished_requests == 0
    assert serve_requests(served, "after-undecodable") == [MAX_TOKENS] * NUM_REQUESTS


def test_shutdown_removes_the_socket_directory(served: Served) -> None:
    served.engine.shutdown()
    assert not served.directory.exists()
    assert list(served.runtime_dir.iterdir()) == []


@pytest.mark.parametrize("runtime_dir", ["missing", "long"])
def test_an_unusable_runtime_dir_falls_back_to_the_temp_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: str) -> None:
    """$XDG_RUNTIME_DIR missing, or so deep that a socket path would not fit sun_path."""
    base = tmp_path / "missing" if runtime_dir == "missing" else tmp_path / ("d" * 100)
    if runtime_dir == "long":
        base.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    directory = make_socket_dir()
    try:
        assert directory.parent == Path(tempfile.gettempdir())
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert len(os.fsencode(directory / "output")) <= MAX_SOCKET_PATH
    finally:
        directory.rmdir()


def test_a_failed_start_removes_the_socket_directory(tmp_path: Path) -> None:
    empty_model = tmp_path / "no-model"
    empty_model.mkdir()
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir()
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(EngineStartError):
            start_async_llm(loop, engine_config(empty_model), XDG_RUNTIME_DIR=str(runtime_dir))
    finally:
        loop.close()
    assert list(runtime_dir.iterdir()) == []


def test_a_killed_makers_socket_directory_is_removed_by_the_next_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process SIGKILLed before its cleanup (a ``-tp`` worker's engine) leaves its socket
    directory; the next one made beside it removes it, and nothing whose maker lives, nor a
    symlink dressed as a stale directory, nor one made in another PID namespace (the Ray
    tests' `unshare --pid` shares this temp dir with the tests running beside them)."""
    with tempfile.TemporaryDirectory(prefix="sd-", dir="/tmp") as base_name:
        base = Path(base_name)
        monkeypatch.setenv("XDG_RUNTIME_DIR", base_name)
        maker = subprocess.Popen(
            [sys.executable, "-c", "import time; from octavo.paths import make_socket_dir; "
             "print(make_socket_dir(), flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True, env={**os.environ})
        assert maker.stdout is not None
        stale = Path(maker.stdout.readline().strip())
        maker.kill()
        maker.wait()
        (stale / "output").write_text("")  # as if a socket were left in it
        kept = base / "kept"
        kept.mkdir()
        namespace = pid_namespace()
        decoy = base / f"{SOCKET_DIR_PREFIX}{namespace}-{maker.pid}-decoy"
        decoy.symlink_to(kept)
        # A directory of a dead pid made in another PID namespace: that pid is not ours.
        elsewhere = base / f"{SOCKET_DIR_PREFIX}{namespace + 1}-{maker.pid}-abcdefgh"
        elsewhere.mkdir()
        live = make_socket_dir()
        assert stale.parent == base and live.parent == base
        assert not stale.exists()
        fresh = make_socket_dir()
        assert live.exists() and fresh.exists() and kept.exists() and decoy.is_symlink()
        assert elsewhere.exists()
