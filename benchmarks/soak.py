"""Soak: mixed traffic against a real ``octavo serve`` for N minutes, sampling the resident
memory and open file descriptors of the server and its engine core; fails (exit 1) when
either grows past its bound, or when any request gets a 5xx or no answer.

    .venv/bin/python benchmarks/soak.py --minutes 30 --output-json soak.json
    .venv/bin/python benchmarks/soak.py --minutes 3 -- --model /path/to/tiny-model

Arguments after ``--`` go to ``octavo serve`` (default: the default model with
``--max-model-len 1024``). The traffic, from ``--concurrency`` clients, cycles through
what a real deployment sees: plain and streamed completions and chats, n=2 sampling,
guided JSON, streams the client abandons mid-way, requests the server must refuse (400),
tokenize, health and metrics probes.

Growth is judged after a warm-up (the first ``--warmup-fraction`` of the run: caches,
allocator pools and the prefix cache fill then): the median of the last minute's samples
against the median of the first minute after warm-up. Bounds: RSS may grow by at most
``--max-rss-growth-mib`` (default 48 MiB) per process, open descriptors by at most
``--max-fd-growth`` (default 8).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import startup  # this folder's: the same launch and stop as the start-up benchmark
from tqdm import tqdm

HOST = startup.HOST
SAMPLE_INTERVAL_S = 5.0
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                 "age": {"type": "integer"}},
               "required": ["name", "age"]}


@dataclass
class Sample:
    elapsed_s: float
    rss_mib: dict[str, float]  # "api" / "engine" -> MiB
    fds: dict[str, int]


@dataclass
class Result:
    minutes: float
    requests: int
    statuses: dict[str, int]  # "kind status" -> count
    failures: list[str]  # 5xx, no answer, or a wrong answer, first 20
    samples: list[Sample] = field(default_factory=list)
    growth: dict[str, dict[str, float]] = field(default_factory=dict)
    passed: bool = False


def main() -> None:
    args, serve_args = parse_args()
    port = startup.free_port()
    log_path = Path(args.log or f"/tmp/octavo-soak-{port}.log")
    server = start_server(port, serve_args or ["--max-model-len", "1024"], log_path)
    try:
        wait_healthy(server, port, log_path)
        result = asyncio.run(soak(args, port, server))
    finally:
        startup.stop(server)
    report(result, args)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(asdict(result), indent=2))
    sys.exit(0 if result.passed else 1)


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:]
    serve_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, serve_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--max-rss-growth-mib", type=float, default=48.0)
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--log", default=None, help="the server's log file")
    return parser.parse_args(argv), serve_args


def start_server(port: int, serve_args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "octavo", "serve", "--host", HOST, "--port", str(port),
               *serve_args]
    with open(log_path, "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_healthy(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    start = time.perf_counter()
    health_s = startup.wait_healthy(server, port, start, log)
    print(f"octavo serve healthy after {health_s:.1f} s")


async def soak(args: argparse.Namespace, port: int, server: subprocess.Popen[bytes]) -> Result:
    result = Result(minutes=args.minutes, requests=0, statuses={}, failures=[])
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + args.minutes * 60
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(f"http://{HOST}:{port}", timeout=timeout) as session:
        clients = [asyncio.ensure_future(client(session, random.Random(args.seed + i),
                                                deadline, statuses, result))
                   for i in range(args.concurrency)]
        with tqdm(total=int(args.minutes * 60), unit="s", desc="soak") as bar:
            while time.monotonic() < deadline:
                result.samples.append(sample(server.pid, time.monotonic() - start))
                await asyncio.sleep(min(SAMPLE_INTERVAL_S, max(deadline - time.monotonic(), 0)))
                bar.n = min(int(time.monotonic() - start), bar.total)
                bar.set_postfix(requests=result.requests, failures=len(result.failures))
        await asyncio.gather(*clients)
    result.samples.append(sample(server.pid, time.monotonic() - start))
    result.statuses = dict(sorted(statuses.items()))
    judge(result, args)
    return result


def sample(pid: int, elapsed: float) -> Sample:
    """The API process and its engine core (the child with the most memory)."""
    api = psutil.Process(pid)
    children = [c for c in api.children(recursive=True) if c.is_running()]
    engine = max(children, key=lambda c: c.memory_info().rss) if children else None
    procs = {"api": api, **({"engine": engine} if engine is not None else {})}
    return Sample(elapsed, {name: p.memory_info().rss / 2**20 for name, p in procs.items()},
                  {name: p.num_fds() for name, p in procs.items()})


async def client(session: aiohttp.ClientSession, rng: random.Random, deadline: float,
                 statuses: Counter[str], result: Result) -> None:
    while time.monotonic() < deadline:
        kind = rng.choice(list(TRAFFIC))
        try:
            status, problem = await TRAFFIC[kind](session, rng)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            status, problem = 0, f"no answer: {type(exc).__name__}: {exc}"
        result.requests += 1
        statuses[f"{kind} {status}"] += 1
        if problem is None and status >= 500:
            problem = f"status {status}"
        if problem is not None and len(result.failures) < 20:
            result.failures.append(f"{kind}: {problem}")


def completion_body(rng: random.Random, **extra: Any) -> dict[str, Any]:
    words = " ".join(rng.choice(["tell", "me", "about", "the", "sea", "and", "stars", "a"])
                     for _ in range(rng.randint(3, 40)))
    return {"prompt": words, "max_tokens": rng.randint(4, 24), "temperature": 0.8,
            "seed": rng.randint(0, 2**31), **extra}


async def post(session: aiohttp.ClientSession, path: str, body: dict[str, Any],
               ) -> tuple[int, Any]:
    async with session.post(path, json=body) as response:
        return response.status, await response.json(content_type=None)


async def completion(session: aiohttp.ClientSession, rng: random.Random,
                     ) -> tuple[int, str | None]:
    status, body = await post(session, "/v1/completions", completion_body(rng))
    return status, None if status != 200 or body["choices"] else "no choices"


async def chat(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    body = {"messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": rng.randint(4, 24), "temperature": 0.8}
    status, _ = await post(session, "/v1/chat/completions", body)
    return status, None


async def n2(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    status, body = await post(session, "/v1/completions", completion_body(rng, n=2))
    return status, None if status != 200 or len(body["choices"]) == 2 else "n=2 not honoured"


async def guided(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    body = {"messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 48,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": JSON_SCHEMA}}}
    status, _ = await post(session, "/v1/chat/completions", body)
    return status, None


async def stream(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    async with session.post("/v1/completions", json=completion_body(rng, stream=True)) as resp:
        lines = [line async for line in resp.content]
    done = any(line.strip() == b"data: [DONE]" for line in lines)
    errors = [line for line in lines if line.startswith(b'data: {"error"')]
    return resp.status, None if done and not errors else f"stream ended badly: {lines[-2:]}"


async def abandon(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    body = completion_body(rng, stream=True, max_tokens=200, ignore_eos=True)
    async with session.post("/v1/completions", json=body) as response:
        for _ in range(rng.randint(1, 4)):
            await response.content.readline()
        response.close()  # hang up mid-stream: the server must abort and free the KV
        return response.status, None


async def refused(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    bad = rng.choice([{"prompt": "hi", "max_tokens": -1}, {"prompt": "\u0004", "max_tokens": 4},
                      {"prompt": "hi", "top_k": 2**63}, {"prompt": "hi", "stop": ["\ud800"]},
                      {"messages": [], "max_tokens": 4}])
    status, body = await post(session, "/v1/completions", bad)
    shaped = isinstance(body, dict) and "error" in body
    return status, None if status == 400 and shaped else f"expected a 400, got {status}"


async def tokenize(session: aiohttp.ClientSession, rng: random.Random,
                   ) -> tuple[int, str | None]:
    status, _ = await post(session, "/tokenize", {"prompt": "hello " * rng.randint(1, 200)})
    return status, None


async def probes(session: aiohttp.ClientSession, rng: random.Random) -> tuple[int, str | None]:
    path = rng.choice(["/health", "/metrics", "/v1/models", "/version"])
    async with session.get(path) as response:
        await response.read()
        return response.status, None if response.status == 200 else f"{path} failed"


TRAFFIC = {"completion": completion, "chat": chat, "n2": n2, "guided": guided,
           "stream": stream, "abandon": abandon, "refused": refused, "tokenize": tokenize,
           "probes": probes}


def judge(result: Result, args: argparse.Namespace) -> None:
    """Growth from the first minute after warm-up to the last minute, per process."""
    total = result.samples[-1].elapsed_s
    warm = [s for s in result.samples if s.elapsed_s >= total * args.warmup_fraction]
    per_minute = max(int(60 / SAMPLE_INTERVAL_S), 1)
    first, last = warm[:per_minute], warm[-per_minute:]
    ok = not result.failures
    for name in first[0].rss_mib:
        rss = _median(last, "rss_mib", name) - _median(first, "rss_mib", name)
        fds = _median(last, "fds", name) - _median(first, "fds", name)
        result.growth[name] = {"rss_mib": round(rss, 1), "fds": fds,
                               "rss_start_mib": round(_median(first, "rss_mib", name), 1)}
        ok = ok and rss <= args.max_rss_growth_mib and fds <= args.max_fd_growth
    result.passed = ok


def _median(samples: list[Sample], what: str, name: str) -> float:
    return statistics.median(getattr(s, what)[name] for s in samples)


def report(result: Result, args: argparse.Namespace) -> None:
    print(f"\nsoak: {result.minutes:g} min, {result.requests} requests, "
          f"{len(result.failures)} failures; load average {os.getloadavg()[0]:.2f}")
    for name, growth in result.growth.items():
        print(f"  {name:6s} RSS {growth['rss_start_mib']:.1f} MiB, grew "
              f"{growth['rss_mib']:+.1f} MiB (bound {args.max_rss_growth_mib:g}); open fds "
              f"grew {growth['fds']:+g} (bound {args.max_fd_growth})")
    print("  statuses: " + ", ".join(f"{k}: {v}" for k, v in result.statuses.items()))
    for failure in result.failures:
        print(f"  FAILED {failure}")
    print("PASSED" if result.passed else "FAILED")


if __name__ == "__main__":
    main()
