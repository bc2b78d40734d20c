"""The server's life: its start-up log, a start that fails, overload, the engine process
dying under it, and its own death (the engine never outlives it)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
from openai import AsyncOpenAI, OpenAI

from ..helpers import run_octavo
from .conftest import TinyModel, start_tiny_server
from .server import Server, free_port, port_is_free, still_running

MAX_WAITING = 2
OVERLOAD_REQUESTS = 8
OVERLOAD_TOKENS = 200  # long enough that the burst arrives while the first runs


@pytest.fixture(scope="module")
def small_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[Server]:
    """One request at a time, and at most MAX_WAITING waiting: easy to overload. It
    restarts its engine, should it die (without --restart-engine the server would exit:
    test_serve_faults.py)."""
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("small-server"),
                           "--max-num-seqs", "1", "--restart-engine",
                           "--max-waiting-requests", str(MAX_WAITING)) as server:
        yield server


def test_start_up_log_names_plugins_platform_model_and_kv_blocks(
        small_server: Server, tiny_model: TinyModel) -> None:
    log = small_server.log()
    print(f"\ntiny server healthy {small_server.ready_s:.1f}s after launch")
    assert "plugins loaded: octavo" in log, log
    assert re.search(rf"platform cpu, model {re.escape(str(tiny_model.folder))}, \d+ KV "
                     "blocks of 16 tokens, max_model_len 512", log), log
    assert f"engine core process pid {small_server.engine_pid()}" in log, log


def test_overload_answers_503_with_retry_after(small_server: Server,
                                               tiny_model: TinyModel) -> None:
    model = str(tiny_model.folder)

    async def one(client: AsyncOpenAI) -> tuple[int, str | None, dict | int]:
        try:
            response = await client.completions.create(
                model=model, prompt="busy", max_tokens=OVERLOAD_TOKENS,
                extra_body={"ignore_eos": True})
        except openai.APIStatusError as exc:
            return exc.status_code, exc.response.headers.get("retry-after"), exc.body
        return 200, None, response.usage.completion_tokens

    async def burst() -> list[tuple[int, str | None, dict | int]]:
        client = AsyncOpenAI(base_url=f"{small_server.url}/v1", api_key="unused",
                             max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*[one(client) for _ in range(OVERLOAD_REQUESTS)])
        finally:
            await client.close()

    results = asyncio.run(burst())
    accepted = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] != 200]
    print(f"\n{OVERLOAD_REQUESTS} at once: {len(accepted)} served, {len(rejected)} got 503")
    assert len(accepted) >= MAX_WAITING, results
    assert all(r[2] == OVERLOAD_TOKENS for r in accepted), results
    assert rejected, results
    for status, retry_after, body in rejected:
        assert (status, retry_after) == (503, "1"), results
        assert isinstance(body, dict) and body["code"] == "overloaded", body
        assert "--max-waiting-requests 2" in body["message"], body
    client = OpenAI(base_url=f"{small_server.url}/v1", api_key="unused", max_retries=0)
    assert client.completions.create(model=model, prompt="calm", max_tokens=3).usage


def test_the_cap_counts_sequences_not_requests(small_server: Server,
                                               tiny_model: TinyModel) -> None:
    """The probe's 60 prompts x n=8 was admitted under a cap of 4: it counted as one
    request. Now its 480 sequences are a 400 (no wait could make room for them), and the
    sequences of a waiting 2-prompt request fill the cap of 2, so a third is refused.

    The engine core is stopped (SIGSTOP) while the pair waits, so nothing can give it a
    token and make room: a streaming request's headers come once the front end has
    counted its sequences, and the third is asked only then. (Keeping the pair waiting
    behind a long request instead raced on a loaded machine: the long one could finish
    first and let the pair run.)"""
    model = str(tiny_model.folder)
    giant = {"model": model, "prompt": ["hi"] * 60, "n": 8, "max_tokens": 2}
    status, _, body = small_server.request("POST", "/v1/completions", giant)
    assert status == 400, body
    assert "480 sequences" in body["error"]["message"], body
    assert "--max-waiting-requests 2" in body["error"]["message"], body

    async def fill_then_ask() -> tuple[int, dict, int]:
        client = AsyncOpenAI(base_url=f"{small_server.url}/v1", api_key="unused",
                             max_retries=0, timeout=120)
        pid = small_server.engine_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            pair = await client.completions.create(
                model=model, prompt=["one", "two"], max_tokens=2, stream=True)
            try:
                await client.with_options(timeout=30).completions.create(
                    model=model, prompt="three", max_tokens=2)  # admitted, it would hang
                refused: tuple[int, dict] = (200, {})
            except openai.APIStatusError as exc:
                refused = (exc.status_code, exc.body)
        finally:
            os.kill(pid, signal.SIGCONT)
        try:
            finished = {choice.index async for chunk in pair for choice in chunk.choices
                        if choice.finish_reason is not None}
            return *refused, len(finished)
        finally:
            await client.close()

    status, body, pair_choices = asyncio.run(fill_then_ask())
    assert status == 503, body
    assert "2 sequences are waiting" in body["message"], body
    assert pair_choices == 2


def test_engine_death_is_noticed_at_once(small_server: Server, tiny_model: TinyModel) -> None:
    model = str(tiny_model.folder)
    client = OpenAI(base_url=f"{small_server.url}/v1", api_key="unused", max_retries=0,
                    timeout=30)
    stream = client.completions.create(model=model, prompt="long", max_tokens=400, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))  # the request is running
    os.kill(small_server.engine_pid(), signal.SIGKILL)
    killed = time.monotonic()
    while small_server.request("GET", "/health")[0] != 503:
        assert time.monotonic() - killed < 1.0, "/health still OK a second after the kill"
        time.sleep(0.01)
    health_s = time.monotonic() - killed
    status, _, body = small_server.request("POST", "/v1/completions",
                                           {"prompt": "hi", "max_tokens": 2})
    request_s = time.monotonic() - killed
    print(f"\nengine killed: /health 503 after {health_s * 1000:.0f} ms, "
          f"new request 503 after {request_s * 1000:.0f} ms")
    assert status == 503 and body["error"]["code"] == "engine_dead", body
    assert request_s < 1.0
    with pytest.raises(openai.APIError, match="the engine is not running"):
        for _ in stream:  # the request in flight ends with an error, not a hang
            pass
    status, _, body = small_server.request("GET", "/health")
    assert status == 503 and "exited" in body["error"]["message"], body

    small_server.proc.send_signal(signal.SIGTERM)  # a server without engine still stops
    small_server.proc.wait(30)
    assert port_is_free(small_server.port)


def test_server_exits_with_the_load_error(tmp_path: Path) -> None:
    start = time.monotonic()
    result = run_octavo("serve", "--model", str(tmp_path / "missing"), "--port",
                        str(free_port()), timeout=120)
    print(f"\nfailed start reported after {time.monotonic() - start:.1f}s")
    assert result.returncode == 1, result.stderr
    assert f"Error: {tmp_path / 'missing'}: no such file or folder" in result.stderr


def test_engine_exits_when_the_server_is_killed(tiny_model: TinyModel, tmp_path: Path) -> None:
    server = start_tiny_server(tiny_model, tmp_path).wait_ready(timeout=180)
    try:
        children = server.processes()[1:]
        assert server.engine_pid() in [p.pid for p in children]
        socket_dirs = {Path(c.laddr).parent for c in psutil.Process(server.proc.pid)
                       .net_connections(kind="unix") if c.laddr}
        assert len(socket_dirs) == 1, socket_dirs  # the engine's private socket directory
        server.proc.kill()  # SIGKILL: the server gets no chance to stop its engine
        server.proc.wait()
        killed = time.monotonic()
        assert still_running(children, timeout=10) == [], children
        print(f"\nserver SIGKILLed: its {len(children)} child processes gone after "
              f"{time.monotonic() - killed:.2f}s")
        assert port_is_free(server.port)
        assert not any(d.exists() for d in socket_dirs), "the engine left its sockets behind"
    finally:
        server.stop()

