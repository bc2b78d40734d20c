"""Ray's start-up overhead: a local cluster's ``ray start`` to every node alive, and
``LLM(...)`` to ready with ``--distributed-executor-backend ray`` beside ``mp`` (same sizes),
on the default model (SmolLM2-135M; 9 heads, so TP must divide 9, and PP=2 is the default
here) or ``--model``. Medians of ``--runs`` engine starts per backend on one cluster,
alternating; each engine answers one short greedy request before it is timed as ready. The
model is loaded once first, so no figure includes a GGUF conversion or the first imports.

Ray runs only inside a loopback-only network namespace (as root; why:
tests/parallel/ray_cluster.py): the script runs itself there, with every raylet on
127.0.0.1 (``--nodes`` of them, ``--cpus-per-node`` each: enough for the workers by default).

    .venv/bin/python benchmarks/ray_startup.py                       # PP=2 on 2 raylets
    .venv/bin/python benchmarks/ray_startup.py --tp 3 --nodes 3 --runs 3
    .venv/bin/python benchmarks/ray_startup.py --model path/to/hf-folder --tp 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.models.loader import load_model_files  # noqa: E402
from tests.parallel.ray_cluster import (  # noqa: E402
    local_ray_cluster,
    private_ray_tmpdir,
    report,
    run_in_loopback_namespace,
)

INSIDE = "--inside-namespace"  # the run inside the namespace (set by the script itself)
TIMEOUT_S = 1800.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    parser.add_argument("--pp", type=int, default=2, help="pipeline_parallel_size")
    parser.add_argument("--nodes", type=int, default=2, help="raylets on 127.0.0.1")
    parser.add_argument("--cpus-per-node", type=int, default=None,
                        help="default: the workers divided over the nodes, rounded up")
    parser.add_argument("--runs", type=int, default=1, help="engine starts per backend")
    parser.add_argument("--output-json", type=Path, default=None)
    parser.add_argument(INSIDE, action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def ready_seconds(model: str | None, backend: str, tp: int, pp: int) -> float:
    """``LLM(...)`` until it has answered one request, then shut down."""
    start = time.monotonic()
    llm = LLM(model, distributed_executor_backend=backend, tensor_parallel_size=tp,
              pipeline_parallel_size=pp)
    try:
        llm.generate(["Hello"], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
        return time.monotonic() - start
    finally:
        llm.shutdown()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    workers = args.tp * args.pp
    cpus = args.cpus_per_node or -(-workers // args.nodes)
    load_model_files(args.model)  # warm: the conversion cache, the imports
    ready: dict[str, list[float]] = {"ray": [], "mp": []}
    with private_ray_tmpdir(), local_ray_cluster(args.nodes, cpus) as cluster:
        for _ in range(args.runs):
            for backend, seconds in ready.items():
                seconds.append(ready_seconds(args.model, backend, args.tp, args.pp))
    return {"nodes": args.nodes, "cpus_per_node": cpus, "tp": args.tp, "pp": args.pp,
            "model": args.model or "default", "cluster_up_s": cluster.seconds,
            "ready_s": {backend: statistics.median(s) for backend, s in ready.items()},
            "runs": ready}


def main() -> None:
    args = parse_args()
    if args.inside_namespace:
        report(measure(args))
        return
    results = run_in_loopback_namespace([sys.executable, __file__, INSIDE, *sys.argv[1:]],
                                        timeout_s=TIMEOUT_S, cwd=REPO)
    ray_s, mp_s = results["ready_s"]["ray"], results["ready_s"]["mp"]
    print(f"{results['model']}, TP={results['tp']} x PP={results['pp']} on {results['nodes']} "
          f"raylets x {results['cpus_per_node']} CPU(s), median of {len(results['runs']['ray'])}")
    print(f"  cluster up (ray start -> all nodes alive)  {results['cluster_up_s']:7.2f} s")
    print(f"  LLM ready, ray                             {ray_s:7.2f} s")
    print(f"  LLM ready, mp                              {mp_s:7.2f} s")
    print(f"  Ray's overhead (ray - mp)                  {ray_s - mp_s:7.2f} s")
    print(f"  cluster up -> ready on ray                 {results['cluster_up_s'] + ray_s:7.2f} s")
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
