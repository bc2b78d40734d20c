"""``octavo bench serve``: an asynchronous client that replays requests against any
OpenAI-compatible ``/v1/completions`` endpoint at a chosen arrival process and records, per
request, when each streamed chunk came back (vLLM's ``bench serve``)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from tqdm.auto import tqdm

from octavo.bench.arrival import RampUp, arrival_offsets
from octavo.bench.datasets import BenchRequest
from octavo.bench.metrics import RequestRecord

# Generous: a long benchmark on a slow machine must not fail on a client-side timeout.
REQUEST_TIMEOUT_S = 6 * 60 * 60


class EndpointError(RuntimeError):
    """The endpoint is unreachable or refuses the benchmark's requests."""


@dataclass
class ServeTarget:
    """Where and how to send: the endpoint's URL, the model name it serves, and the
    request options every request carries."""

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    api_key: str | None = None
    ignore_eos: bool = True

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def payload(self, request: BenchRequest) -> dict[str, Any]:
        """A streaming completion that asks for usage, so output lengths are the server's
        count; greedy and (an extension vLLM and Octavo accept) ``ignore_eos`` for exact
        lengths."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": request.prompt, "max_tokens": request.output_len,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass
class ServeRun:
    """One benchmark run: its setting, every request's record, and how long it lasted."""

    request_rate: float  # ignored when ramp_up is set
    burstiness: float
    max_concurrency: int | None
    ramp_up: RampUp | None
    records: list[RequestRecord]
    duration_s: float
    # Requests each engine finished during the run, from the server's /metrics (data
    # parallelism); None when the server publishes no per-engine counts.
    requests_per_engine: dict[str, int] | None = None


async def send_request(session: aiohttp.ClientSession, target: ServeTarget,
                       request: BenchRequest, t0: float) -> RequestRecord:
    """Send one streaming request and time its chunks; failures are recorded, not raised,
    so one bad reply does not end the benchmark."""
    record = RequestRecord(prompt_len=request.prompt_len, start=time.perf_counter() - t0)
    sent = t0 + record.start
    last = sent
    chunks = 0
    try:
        async with session.post(target.url, json=target.payload(request),
                                headers=target.headers()) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:500]}"
                return record
            async for data in _sse_events(response):
                now = time.perf_counter()
                if data.get("choices"):
                    if chunks == 0:
                        record.ttft = now - sent
                    else:
                        record.itl.append(now - last)
                    chunks += 1
                    last = now
                if data.get("usage"):
                    record.output_len = int(data["usage"]["completion_tokens"])
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.latency = time.perf_counter() - sent
    record.output_len = record.output_len or chunks  # an endpoint that sends no usage
    record.success = chunks > 0
    if not record.success:
        record.error = "the stream carried no tokens"
    return record


async def _sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to ``data: [DONE]``."""
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        data = json.loads(payload)
        if "error" in data:
            raise ValueError(f"the server reported an error mid-stream: {data['error']}")
        yield data


async def fetch_model_name(base_url: str, api_key: str | None = None) -> str:
    """The first model ``GET /v1/models`` lists: what to name in requests when the user did
    not say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
            if r.status != 200:
                raise EndpointError(f"GET {url} answered HTTP {r.status}: {await r.text()}")
            models = (await r.json()).get("data") or []
    except aiohttp.ClientError as exc:
        raise EndpointError(f"cannot reach {url}: {exc}") from None
    if not models:
        raise EndpointError(f"GET {url} lists no model; name one with --model")
    return str(models[0]["id"])


async def engine_request_counts(target: ServeTarget) -> dict[str, int] | None:
    """Finished requests by engine, as ``/metrics`` counts them (the ``engine`` label of
    Octavo's and vLLM's ``e2e_request_latency_seconds`` histograms); None without them."""
    from prometheus_client.parser import text_string_to_metric_families

    url = target.base_url.rstrip("/") + "/metrics"
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(url, headers=target.headers()) as response:
            if response.status != 200:
                return None
            text = await response.text()
    except aiohttp.ClientError:
        return None
    counts = {sample.labels["engine"]: int(sample.value)
              for family in text_string_to_metric_families(text) for sample in family.samples
              if sample.name.endswith(":e2e_request_latency_seconds_count")
              and "engine" in sample.labels}
    return counts or None


def _counted(before: dict[str, int] | None,
             after: dict[str, int] | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    return {engine: count - before.get(engine, 0) for engine, count in sorted(after.items())}


async def _run(target: ServeTarget, requests: list[BenchRequest], offsets: list[float],
               max_concurrency: int | None, show_progress: bool,
               ) -> tuple[list[RequestRecord], float, dict[str, int] | None]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)
    limit = asyncio.Semaphore(max_concurrency or len(requests))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        probe = await send_request(session, target, requests[0], time.perf_counter())
        if not probe.success:
            raise EndpointError(f"the first test request to {target.url} failed: {probe.error}")
        before = await engine_request_counts(target)  # the probe's already counted
        bar = tqdm(total=len(requests), desc="Requests", unit="req", disable=not show_progress,
                   dynamic_ncols=True)
        t0 = time.perf_counter()

        async def limited(request: BenchRequest) -> RequestRecord:
            async with limit:
                record = await send_request(session, target, request, t0)
            bar.update(1)
            return record

        tasks = []
        for request, offset in zip(requests, offsets):
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(limited(request)))
        records = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
        bar.close()
    return records, duration, _counted(before, await engine_request_counts(target))


def run_serve(target: ServeTarget, requests: list[BenchRequest], request_rate: float = math.inf,
              burstiness: float = 1.0, max_concurrency: int | None = None,
              ramp_up: RampUp | None = None, seed: int = 0,
              show_progress: bool = True) -> ServeRun:
    """Send ``requests`` at ``request_rate`` per second (Gamma gaps of shape ``burstiness``;
    ``ramp_up`` instead moves the rate over the run), at most ``max_concurrency`` in flight.
    One untimed test request goes first, so a wrong URL or model fails at once."""
    if not requests:
        raise ValueError("no requests to send")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {max_concurrency}")
    offsets = arrival_offsets(len(requests), request_rate, burstiness, seed, ramp_up).tolist()
    records, duration, per_engine = asyncio.run(
        _run(target, requests, offsets, max_concurrency, show_progress))
    return ServeRun(request_rate, burstiness, max_concurrency, ramp_up, records, duration,
                    per_engine)
