"""Overload at 4x capacity: 1,024 streaming requests at once against --max-num-seqs 256,
with and without --max-waiting-requests. Every request completes or gets 503 with
Retry-After, none hangs past its deadline, and once the burst is over and the KV cache is
free again the server's memory is back to within 20% of what it was before.

The default model, as the probe ran it (a tiny model answers too fast to be overloaded).
"Before" is measured after a first burst of the same size: the KV cache's pages are
committed by the OS when first written, so the first burst adds what the cache takes, once;
what must not happen is growth on every burst."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from .server import Server

REQUESTS = 1024
MAX_NUM_SEQS = 256
TOKENS = 8
DEADLINE_S = 180.0


async def one_stream(session: aiohttp.ClientSession, index: int) -> tuple[str, int]:
    """("done", tokens) for a full stream, ("503", 0) for a refusal with Retry-After, or
    what went wrong."""
    body = {"prompt": f"request {index} says", "max_tokens": TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    async with session.post("/v1/completions", json=body) as response:
        if response.status == 503:
            await response.read()
            ok = response.headers.get("Retry-After") == "1"
            return ("503" if ok else "503 without Retry-After"), 0
        lines = [line.strip() async for line in response.content if line.strip()]
    if response.status != 200 or lines[-1] != b"data: [DONE]":
        return f"status {response.status}, ended {lines[-1:]}", 0
    usage = [line for line in lines if b'"usage":{' in line]
    return "done", int(usage[-1].split(b'"completion_tokens":')[1].split(b",")[0])


async def burst(server: Server) -> list[tuple[str, int]]:
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    connector = aiohttp.TCPConnector(limit=0)  # all at once, as the probe did
    async with aiohttp.ClientSession(server.url, timeout=timeout, connector=connector) as s:
        results = await asyncio.gather(*[one_stream(s, i) for i in range(REQUESTS)],
                                       return_exceptions=True)
    return [r if isinstance(r, tuple) else (f"{type(r).__name__}: {r}", 0) for r in results]


def rss_mib(server: Server) -> dict[str, float]:
    return {f"{p.pid}": p.memory_info().rss / 2**20 for p in server.processes()
            if "resource_tracker" not in " ".join(p.cmdline())}


def wait_idle(server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0 and \
                m["vllm:kv_cache_usage_perc"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the engine is not idle {timeout} s after the burst")


@pytest.mark.parametrize("max_waiting", [None, 64])
def test_a_4x_burst_completes_or_is_refused(tmp_path: Path, max_waiting: int | None) -> None:
    args = ["--max-num-seqs", str(MAX_NUM_SEQS)]
    if max_waiting is not None:
        args += ["--max-waiting-requests", str(max_waiting)]
    server = Server(args, tmp_path / "server.log").wait_ready(180)
    try:
        fresh = rss_mib(server)
        asyncio.run(burst(server))
        wait_idle(server)
        before = rss_mib(server)
        start = time.monotonic()
        results = asyncio.run(burst(server))
        seconds = time.monotonic() - start
        wait_idle(server)
        time.sleep(1)
        after = rss_mib(server)
        normal = server.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    finally:
        server.stop()
    outcomes: dict[str, int] = {}
    for outcome, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"\n{REQUESTS} streams, --max-waiting-requests {max_waiting}: {outcomes} in "
          f"{seconds:.1f} s; RSS MiB fresh {fresh}, after a first burst {before}, after "
          f"the second {after}")
    assert set(outcomes) <= {"done", "503"}, outcomes
    assert all(tokens == TOKENS for outcome, tokens in results if outcome == "done")
    if max_waiting is None:
        assert outcomes == {"done": REQUESTS}
    else:
        assert outcomes["done"] >= max_waiting and outcomes.get("503", 0) > 0
    assert seconds < DEADLINE_S
    for pid, mib in before.items():
        assert after.get(pid, 0) <= mib * 1.2, (pid, mib, after)
    assert normal[0] == 200, normal
