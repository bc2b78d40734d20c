"""How long ``octavo serve`` takes to answer: from launching the command to ``GET /health``
returning 200, and to the first completion returning - with a cold conversion cache (a
fresh, empty ``OCTAVO_CACHE_DIR``: the GGUF is converted) and a warm one (the entry the cold
runs left). Medians of ``--runs`` launches each; the peak RSS of the server's processes at
their first completion comes with every run.

    .venv/bin/python benchmarks/startup.py                     # default model, 3 + 3 runs
    .venv/bin/python benchmarks/startup.py --runs 5 --serve-args "--dtype bfloat16"
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from peak_rss import PeakRss, describe

from octavo.net import free_port

HOST = "127.0.0.1"
READY_TIMEOUT_S = 600
POLL_S = 0.05


@dataclass
class StartupRun:
    cache: str  # "cold" or "warm"
    health_s: float  # launch -> GET /health 200
    first_completion_s: float  # launch -> a completion returned
    peak_rss: str  # the server's processes at the first completion


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="launches per cache state")
    parser.add_argument("--serve-args", default="",
                        help="extra `octavo serve` arguments, e.g. \"--model m.gguf\"")
    parser.add_argument("--output-json", type=Path, default=None)
    return parser.parse_args()



def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def launch_once(serve_args: list[str], cache_dir: Path, cache: str, log: Path) -> StartupRun:
    port = free_port()
    command = [sys.executable, "-m", "octavo", "serve", "--host", HOST, "--port", str(port),
               *serve_args]
    env = {**os.environ, "OCTAVO_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    memory = PeakRss(proc.pid)
    try:
        health_s = wait_healthy(proc, port, start, log)
        status, body = request(port, "POST", "/v1/completions",
                               {"prompt": "The capital of France is", "max_tokens": 8})
        first_s = time.perf_counter() - start
        if status != 200:
            raise SystemExit(f"completion failed with {status}: {body[:500]!r}")
        return StartupRun(cache, health_s, first_s, describe(memory.stop()))
    finally:
        memory.stop()
        stop(proc)


def wait_healthy(proc: subprocess.Popen, port: int, start: float, log: Path) -> float:
    while time.perf_counter() - start < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise SystemExit(f"octavo serve exited with {proc.returncode}:\n"
                             f"{log.read_text()[-3000:]}")
        try:
            if request(port, "GET", "/health")[0] == 200:
                return time.perf_counter() - start
        except OSError:
            pass  # not listening yet
        time.sleep(POLL_S)
    raise SystemExit(f"octavo serve not healthy after {READY_TIMEOUT_S} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL of the whole process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def main() -> None:
    args = parse_args()
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    serve_args = shlex.split(args.serve_args)
    runs: list[StartupRun] = []
    with tempfile.TemporaryDirectory(prefix="octavo-startup-") as work:
        work_dir = Path(work)
        warm_cache = work_dir / "warm-cache"
        for i in range(args.runs):  # each cold run converts into a cache of its own
            cache_dir = work_dir / f"cold-cache-{i}"
            runs.append(launch_once(serve_args, cache_dir, "cold", work_dir / f"cold-{i}.log"))
            print(f"cold run {i + 1}: {runs[-1]}", flush=True)
            if not warm_cache.exists():  # the warm runs start from the first cold one's
                cache_dir.rename(warm_cache)
        for i in range(args.runs):
            runs.append(launch_once(serve_args, warm_cache, "warm", work_dir / f"warm-{i}.log"))
            print(f"warm run {i + 1}: {runs[-1]}", flush=True)
    print(f"\noctavo serve {' '.join(serve_args)}: medians of {args.runs} launches")
    print("| cache | to /health 200 (s) | to first completion (s) |")
    print("|---|---|---|")
    for cache in ("cold", "warm"):
        mine = [r for r in runs if r.cache == cache]
        print(f"| {cache} | {statistics.median(r.health_s for r in mine):.2f} | "
              f"{statistics.median(r.first_completion_s for r in mine):.2f} |")
    if args.output_json:
        args.output_json.write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")


if __name__ == "__main__":
    main()
