"""``octavo proxy`` over two real ``octavo serve`` processes - a prefill instance saving
prompt KV through the shared-storage connector, a decode instance loading it - driven by
the official openai client, streaming; then the prefill instance is killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import OpenAI

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed

from .conftest import TINY_SERVER_ARGS, TinyModel
from .server import HOST, ONE_THREAD_ENV, Server, free_port

MAX_TOKENS = 8
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


class ProxyProcess:
    def __init__(self, prefill: Server, decode: Server, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        command = [sys.executable, "-m", "octavo", "proxy", "--prefill", prefill.url,
                   "--decode", decode.url, "--port", str(self.port), "--host", HOST,
                   "--probe-interval", "0.5"]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **ONE_THREAD_ENV})
        self.url = f"http://{HOST}:{self.port}"

    def status(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/status", timeout=10) as response:
            return dict(json.loads(response.read()))

    def wait_ready(self, timeout: float) -> ProxyProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                self.status()
                return self
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"proxy not up after {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def deployment(tiny_model: TinyModel, tmp_path: Path) -> Iterator[tuple[Server, Server,
                                                                          ProxyProcess]]:
    store = str(tmp_path / "kv")
    servers = [Server(["--model", str(tiny_model.folder), *TINY_SERVER_ARGS,
                       "--kv-transfer-config",
                       json.dumps({"connector": "shared_storage", "role": role,
                                   "path": store})], tmp_path / f"{role}.log")
               for role in ("producer", "consumer")]
    proxy = None
    try:
        for server in servers:
            server.wait_ready(timeout=180)
        proxy = ProxyProcess(servers[0], servers[1], tmp_path / "proxy.log").wait_ready(180)
        yield servers[0], servers[1], proxy
    finally:
        if proxy is not None:
            proxy.stop()
        for server in servers:
            server.stop()


def test_proxy_streams_decode_answers_and_survives_losing_prefill(
        tiny_model: TinyModel, deployment: tuple[Server, Server, ProxyProcess]) -> None:
    prefill, decode, proxy = deployment
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    why = f"model seed {tiny_model.seed}, prompt seed {seed}"
    # Byte-level tokenizer: 40-90 characters are that many prompt tokens (several blocks).
    prompts = ["".join(chr(c) for c in rng.integers(97, 123, int(n)))
               for n in rng.integers(40, 90, 12)]
    offline = LLM(model=str(tiny_model.folder), dtype="float32", kv_cache_memory=8 * 2**20)
    expected = [o.outputs[0].text for o in offline.generate(
        prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
        use_tqdm=False)]
    client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    model = str(tiny_model.folder)

    def complete(index: int) -> str:
        chunks = client.completions.create(model=model, prompt=prompts[index], stream=True,
                                           max_tokens=MAX_TOKENS, **GREEDY)
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    # Healthy: every answer is the single engine's, and the decode instance loaded prompts.
    assert [complete(i) for i in range(4)] == expected[:4], why
    loaded = decode.metrics()
    assert loaded["octavo:kv_transfer_loads_total"] == 4, why
    assert loaded["octavo:kv_transfer_loaded_tokens_total"] > 0, why
    assert prefill.metrics()["octavo:kv_transfer_saves_total"] == 4, why
    # Chat goes the same way; its answer is the decode instance's own.
    messages = [{"role": "user", "content": prompts[0]}]
    chunks = client.chat.completions.create(model=model, messages=messages, stream=True,
                                            max_completion_tokens=MAX_TOKENS, **GREEDY)
    direct = OpenAI(base_url=decode.url + "/v1", api_key="unused").chat.completions.create(
        model=model, messages=messages, max_completion_tokens=MAX_TOKENS, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        direct.choices[0].message.content, why
    assert decode.metrics()["octavo:kv_transfer_loads_total"] == 5, why

    # Kill the prefill instance while requests keep coming: none is lost.
    stop = threading.Event()
    answers: list[tuple[int, str]] = []

    def client_loop(worker: int) -> None:
        index = 4 + worker
        while not stop.is_set():
            answers.append((index, complete(index)))
            index = 4 + (index - 3) % 8

    with ThreadPoolExecutor(3) as pool:
        loops = [pool.submit(client_loop, worker) for worker in range(3)]
        time.sleep(1.0)
        os.killpg(prefill.proc.pid, signal.SIGKILL)
        time.sleep(2.0)
        stop.set()
        for loop in loops:
            loop.result()  # a lost request raises here
    assert answers, why
    wrong = [(i, text) for i, text in answers if text != expected[i]]
    assert not wrong, f"{why}: {wrong}"
    status = proxy.status()
    assert status["prefill"][0]["healthy"] is False, status
    assert status["stats"]["prefill_failures"] >= 1, status
    assert status["stats"]["decoded_without_prefill"] >= 1, status
    assert status["stats"]["failed_requests"] == 0, status
    assert "out of rotation" in proxy.log_path.read_text(), why
