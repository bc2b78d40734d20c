"""Many clients at once: 64 concurrent streams all get exactly the tokens they asked for,
and clients that hang up mid-stream have their requests aborted and KV blocks freed."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from openai import AsyncOpenAI

from octavo.testing.seeds import draw_seed

from .conftest import TinyModel
from .server import API_KEY, Server

NUM_STREAMS = 64
NUM_DISCONNECTS = 10
DISCONNECT_MAX_TOKENS = 400


def async_client(server: Server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120)


async def stream_one(client: AsyncOpenAI, model: str, prompt: str,
                     max_tokens: int) -> tuple[int, int, str | None]:
    """(tokens seen in chunks, completion tokens in the usage chunk, finish reason)."""
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.8, logprobs=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    seen, usage, finish = 0, -1, None
    async for chunk in stream:
        for choice in chunk.choices:
            seen += len(choice.logprobs.tokens)
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return seen, usage, finish


async def hang_up(client: AsyncOpenAI, model: str, prompt: str) -> int:
    """Read a few chunks of a long stream, then close the connection."""
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=DISCONNECT_MAX_TOKENS, stream=True,
        logprobs=0, extra_body={"ignore_eos": True})
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == 3:
            break
    await stream.close()
    return chunks


def wait_for_idle_engine(server: Server, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        idle = (metrics["vllm:num_requests_running"] == 0
                and metrics["vllm:num_requests_waiting"] == 0
                and metrics["vllm:kv_cache_usage_perc"] == 0)
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


def test_concurrent_streams_and_disconnects(tiny_server: Server,
                                            tiny_model: TinyModel) -> None:
    model = str(tiny_model.folder)
    rng = np.random.default_rng(draw_seed())
    max_tokens = [int(n) for n in rng.integers(8, 48, NUM_STREAMS)]
    prompts = [f"client {i}: " + "word " * int(rng.integers(1, 30)) for i in range(NUM_STREAMS)]
    before = tiny_server.metrics()

    async def run_streams() -> list[tuple[int, int, str | None]]:
        client = async_client(tiny_server)
        try:
            return await asyncio.gather(*[stream_one(client, model, p, n)
                                          for p, n in zip(prompts, max_tokens)])
        finally:
            await client.close()

    start = time.monotonic()
    results = asyncio.run(run_streams())
    elapsed = time.monotonic() - start
    print(f"\n{NUM_STREAMS} concurrent streams, {sum(max_tokens)} tokens: {elapsed:.2f}s")
    assert results == [(n, n, "length") for n in max_tokens], f"model seed {tiny_model.seed}"
    after = tiny_server.metrics()
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated == sum(max_tokens)
    ttfts = (after["vllm:time_to_first_token_seconds_count"]
             - before["vllm:time_to_first_token_seconds_count"])
    assert ttfts == NUM_STREAMS

    async def run_hang_ups() -> list[int]:
        client = async_client(tiny_server)
        try:
            return await asyncio.gather(*[hang_up(client, model, f"leaving {i} " * 4)
                                          for i in range(NUM_DISCONNECTS)])
        finally:
            await client.close()

    start = time.monotonic()
    assert asyncio.run(run_hang_ups()) == [3] * NUM_DISCONNECTS
    metrics = wait_for_idle_engine(tiny_server, timeout=10)
    freed_s = time.monotonic() - start
    print(f"{NUM_DISCONNECTS} clients hung up; engine idle, KV blocks freed after {freed_s:.2f}s")
    assert metrics["vllm:num_requests_running"] == 0, metrics
    assert metrics["vllm:num_requests_waiting"] == 0, metrics
    assert metrics["vllm:kv_cache_usage_perc"] == 0, metrics
    # Aborted, not run to the end: far fewer tokens than they asked for.
    generated = metrics["vllm:generation_tokens_total"] - after["vllm:generation_tokens_total"]
    assert generated < NUM_DISCONNECTS * DISCONNECT_MAX_TOKENS / 2, generated
