"""``octavo serve --data-parallel-size 2``: two engine cores (one core each) behind one
server, on the default model (SmolLM2-135M).

- The 64 W1 prompts (their first 64 tokens: the full 256 made this the e2e folder's
  slowest test, 123 s of fp32 prefill, for the same check), greedy, give the same text as
  one engine, and land 32 +- 6 on each engine (the per-engine counts of ``/metrics``); a
  second burst sent while the first runs is balanced too.
- Nothing listens beyond loopback: the HTTP port is its only TCP listener.
- One engine SIGKILLed mid-load: every request either completes or gets an error (none
  hangs, none is lost silently), ``/health`` says ``degraded``, and the survivor serves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from octavo.bench.workloads import build_workload

from .server import Server, tcp_listeners, wildcard_listeners

pytestmark = pytest.mark.slow

SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory", "64MiB"]
MAX_TOKENS = 16
BALANCE_SLACK = 6  # of 32 per engine
SHORT = 64  # prompt tokens, where only the balance or the failure is looked at


def requests_per_engine(server: Server) -> dict[str, int]:
    """Finished requests by engine, from /metrics."""
    status, _, text = server.request("GET", "/metrics")
    assert status == 200, text
    return {sample.labels["engine"]: int(sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "vllm:e2e_request_latency_seconds_count"}


def complete_all(server: Server, prompts: list[list[int]], max_tokens: int = MAX_TOKENS,
                 ) -> list[str | Exception]:
    """Each prompt's greedy text (or the error it got), all sent at once."""
    # Equality and balance are measured, not speed: a slow CPU (AVX2 only) takes minutes.
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)

    def one(prompt: list[int]) -> str | Exception:
        try:
            return client.completions.create(
                model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=max_tokens,
                temperature=0, extra_body={"ignore_eos": True}).choices[0].text
        except openai.APIError as exc:
            return exc

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


@pytest.fixture(scope="module")
def w1_prompts() -> list[list[int]]:
    return build_workload("W1_throughput").prompts


@pytest.fixture(scope="module")
def short_prompts(w1_prompts: list[list[int]]) -> list[list[int]]:
    return [prompt[:SHORT] for prompt in w1_prompts]


@pytest.fixture(scope="module")
def dp2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_dir = tmp_path_factory.mktemp("dp2")
    with Server([*SERVER_ARGS, "--data-parallel-size", "2"], log_dir / "server.log") as server:
        yield server


def test_dp2_equals_one_engine_and_balances(dp2_server: Server, short_prompts: list[list[int]],
                                            tmp_path: Path) -> None:
    with Server(SERVER_ARGS, tmp_path / "dp1.log") as dp1:
        reference = complete_all(dp1, short_prompts)
    assert all(isinstance(text, str) for text in reference), reference
    before = requests_per_engine(dp2_server)
    texts = complete_all(dp2_server, short_prompts)
    after = requests_per_engine(dp2_server)
    landed = {engine: after[engine] - before.get(engine, 0) for engine in after}
    print(f"\nW1 burst of 64 on DP=2: {landed} requests per engine")
    assert sorted(landed) == ["0", "1"]
    assert all(abs(count - 32) <= BALANCE_SLACK for count in landed.values()), landed
    differing = [i for i, (a, b) in enumerate(zip(texts, reference)) if a != b]
    assert not differing, f"prompts {differing} differ from one engine's output"


def test_a_burst_while_one_runs_is_balanced(dp2_server: Server,
                                            short_prompts: list[list[int]]) -> None:
    before = requests_per_engine(dp2_server)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(complete_all, dp2_server, short_prompts[:32], 64)
        time.sleep(1.0)  # the first burst is running when the second arrives
        second = pool.submit(complete_all, dp2_server, short_prompts[32:], 8)
        results = first.result() + second.result()
    assert all(isinstance(text, str) for text in results), results
    after = requests_per_engine(dp2_server)
    landed = {engine: after[engine] - before[engine] for engine in after}
    print(f"\ntwo bursts of 32: {landed} requests per engine")
    assert all(abs(count - 32) <= BALANCE_SLACK for count in landed.values()), landed


def test_bench_serve_reports_requests_per_engine(dp2_server: Server, tmp_path: Path) -> None:
    result_path = tmp_path / "serve.json"
    done = subprocess.run(
        [sys.executable, "-m", "octavo", "bench", "serve", "--base-url", dp2_server.url,
         "--num-prompts", "16", "--random-input-len", "32", "--random-output-len", "8",
         "--save-result", str(result_path), "--disable-tqdm"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "requests per engine" in done.stdout, done.stdout
    counts = json.loads(result_path.read_text())["runs"][0]["requests_per_engine"]
    assert sorted(counts) == ["0", "1"] and sum(counts.values()) == 16, counts
    assert min(counts.values()) >= 16 // 2 - BALANCE_SLACK, counts


def test_dp2_listens_only_on_loopback(dp2_server: Server) -> None:
    """Its engines' sockets are ``ipc://`` paths: the HTTP port, on 127.0.0.1, is the only
    TCP listener of the server and its engines (``ss -ltnp``)."""
    listeners = tcp_listeners(dp2_server.processes())
    print(f"\n-dp 2 listeners: {listeners}")
    assert len(dp2_server.processes()) >= 3  # the server and its two engine cores
    assert wildcard_listeners(listeners) == [], listeners
    assert [line.split()[0] for line in listeners] == [f"127.0.0.1:{dp2_server.port}"]


def test_one_engine_killed_mid_load(dp2_server: Server,
                                    short_prompts: list[list[int]]) -> None:
    """Last: it leaves the module's server with one engine."""
    server = dp2_server
    status, _, health = server.request("GET", "/health")
    victim = health["engines"][1]["pid"]
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(complete_all, server, short_prompts[:32], 96)
        time.sleep(2.0)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        status, _, health = server.request("GET", "/health")
        while health["status"] != "degraded" and time.monotonic() - killed < 5:
            status, _, health = server.request("GET", "/health")
        degraded_s = time.monotonic() - killed
        results = load.result(timeout=120)
    done = [r for r in results if isinstance(r, str)]
    failed = [r for r in results if isinstance(r, Exception)]
    print(f"\nengine 1 killed mid-load: /health degraded after {degraded_s * 1000:.0f} ms; "
          f"{len(done)} completed, {len(failed)} errors")
    assert status == 200 and health["status"] == "degraded", health
    assert [engine["alive"] for engine in health["engines"]] == [True, False]
    assert len(done) + len(failed) == 32
    assert failed and done, "the kill should fail engine 1's requests only"
    assert all(isinstance(exc, openai.InternalServerError) for exc in failed), failed
    after = complete_all(server, short_prompts[32:40])
    assert all(isinstance(text, str) for text in after), after
