"""The ``ray`` executor's checks, on one local two-raylet cluster: run by
``tests/parallel/test_ray.py`` inside a loopback-only namespace as
``python -m tests.parallel.ray_checks``; it reports its findings (``ray_cluster.report``),
which the test asserts (a check that raised holds its traceback under "error").

Each raylet has one CPU, so the two ranks of TP=2 (or PP=2) must land on both "nodes", and
their tensor collectives run over gloo, as across machines. In order:

- no cluster yet: the engine is refused with a message that says how to start one;
- the cluster's start (``ray start`` to both nodes alive) is timed;
- TP=2 on ray: start-up timed, the ranks' nodes, greedy tokens and first-step logprobs,
  then the same on ``mp``; and PP=2 likewise;
- rank 1 fails to start (OCTAVO_CPU_OMP_THREADS_BIND names a missing core): the engine
  fails at once with its error;
- PP=2 on ray, then one actor killed with ``ray.kill``: ``on_failure`` must run, the other
  actor must be killed, and the next step must fail with ``WorkerDiedError``;
- a child process holding a TP=2 ray engine is killed (SIGKILL): its actors must end too;
- TP=4 on a cluster of two CPUs: refused, saying what the cluster has and needs;
- after all that, the cluster's CPUs are free and every placement group removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray

from octavo.config import ConfigError
from octavo.cpu.threads import THREADS_BIND_ENV
from octavo.executor.base import WorkerDiedError
from octavo.net import free_port
from octavo.sampling_params import SamplingParams
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import generate, make_llm, max_logprob_gap
from .ray_cluster import local_ray_cluster, private_ray_tmpdir, report
from .test_tensor_parallel import random_prompts

MAX_TOKENS = 16
NOTICE_TIMEOUT_S = 30.0  # for on_failure after a kill; the test asserts much less
RELEASE_TIMEOUT_S = 30.0
HOLD = "--hold"  # argv of the child that holds an engine until it is killed
HELD = "HELD"
HOLD_S = 120.0
SERVE_READY_S = 120.0


def guarded(check: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The check's findings, or its traceback: one check failing leaves the others' runs."""
    try:
        return check(*args, **kwargs)
    except Exception:
        return {"error": traceback.format_exc()}


def refused(**engine: Any) -> dict[str, Any]:
    """Start a ray engine that must be refused; the error and how long it took."""
    start = time.monotonic()
    try:
        make_llm(**engine).shutdown()
    except ConfigError as exc:
        return {"refused": str(exc), "seconds": time.monotonic() - start}
    return {"refused": None}


def on_ray_and_mp(model: str, prompts: list[list[int]], **sizes: int) -> dict[str, Any]:
    """The same greedy run on ray and on mp: tokens, logprob gap, placement, start-up."""
    start = time.monotonic()
    llm = make_llm(model, distributed_executor_backend="ray", **sizes)
    ready_s = time.monotonic() - start
    try:
        placement = [p.node_id for p in llm.llm_engine.core.executor.placement]
        on_ray = generate(llm, prompts, MAX_TOKENS)
    finally:
        llm.shutdown()
    left_ray = not ray.is_initialized()  # the executor joined the cluster, so it leaves
    start = time.monotonic()
    llm = make_llm(model, distributed_executor_backend="mp", **sizes)
    mp_ready_s = time.monotonic() - start
    try:
        on_mp = generate(llm, prompts, MAX_TOKENS)
    finally:
        llm.shutdown()
    return {"ray_tokens": on_ray.tokens, "mp_tokens": on_mp.tokens,
            "logprob_gap": max_logprob_gap(on_ray, on_mp), "node_ids": placement,
            "ready_s": ready_s, "mp_ready_s": mp_ready_s, "left_ray": left_ray}


def start_fails(model: str) -> dict[str, Any]:
    """Rank 1 cannot bind its threads (a core that does not exist, in an OCTAVO_* setting
    that must reach the actors): the start must fail at once with rank 1's error."""
    os.environ[THREADS_BIND_ENV] = "0|4095"
    start = time.monotonic()
    try:
        make_llm(model, distributed_executor_backend="ray", tensor_parallel_size=2).shutdown()
        error = None
    except WorkerDiedError as exc:
        error = str(exc)
    finally:
        del os.environ[THREADS_BIND_ENV]
    return {"error_text": error, "seconds": time.monotonic() - start}


def kill_one_actor(model: str, prompts: list[list[int]]) -> dict[str, Any]:
    """PP=2 on ray; kill the last stage's actor, then try another step."""
    llm = make_llm(model, distributed_executor_backend="ray", pipeline_parallel_size=2)
    try:
        executor = llm.llm_engine.core.executor
        reasons: list[str] = []
        noticed = threading.Event()
        executor.on_failure = lambda reason: (reasons.append(reason), noticed.set())
        killed = time.monotonic()
        ray.kill(executor.actors[1])
        noticed.wait(NOTICE_TIMEOUT_S)
        notice_s = time.monotonic() - killed
        try:
            ray.get(executor.actors[0].rendezvous.remote(), timeout=NOTICE_TIMEOUT_S)
            other_killed = False
        except ray.exceptions.RayActorError:
            other_killed = True
        start = time.monotonic()
        try:
            llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=4),
                         use_tqdm=False)
            step_error = None
        except WorkerDiedError as exc:
            step_error = str(exc)
        step_s = time.monotonic() - start
    finally:
        llm.shutdown()
    return {"reasons": reasons, "notice_s": notice_s, "other_killed": other_killed,
            "step_error": step_error, "step_s": step_s}


def engine_killed(model: str) -> dict[str, Any]:
    """A process holding a ray engine is killed (SIGKILL): its actors must go with it."""
    holder = subprocess.Popen([sys.executable, "-m", "tests.parallel.ray_checks", HOLD, model],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().strip() == HELD  # "" if it died instead
        actors_before = len(actor_pids())
        holder.kill()
        holder.wait()
        killed = time.monotonic()
        while actor_pids() and time.monotonic() - killed < RELEASE_TIMEOUT_S:
            time.sleep(0.05)
        return {"held": held, "actors_before": actors_before, "actors_after": len(actor_pids()),
                "gone_s": time.monotonic() - killed}
    finally:
        holder.kill()
        holder.wait()


def serve_on_ray(model: str) -> dict[str, Any]:
    """``octavo serve --data-parallel-size 2 --data-parallel-backend ray``: launch to ready
    timed, eight concurrent greedy completions, each engine's share from /metrics, then
    SIGTERM: the server exits 0 and its engine actors are gone."""
    from ..e2e.server import Server
    from ..e2e.test_serve_data_parallel import requests_per_engine

    with tempfile.TemporaryDirectory(prefix="serve-ray-") as folder:
        server = Server(["--model", model, "--dtype", "float32", "--kv-cache-memory", "32MiB",
                         "--data-parallel-size", "2", "--data-parallel-backend", "ray",
                         "--data-parallel-rpc-port", str(free_port())],
                        Path(folder) / "server.log")
        try:
            server.wait_ready(timeout=SERVE_READY_S)
            body = {"model": model, "prompt": "Tell me a story", "max_tokens": 8,
                    "temperature": 0, "ignore_eos": True}
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: server.request("POST", "/v1/completions",
                                                                 body), range(8)))
            _, _, health = server.request("GET", "/health")
            found = {"ready_s": server.ready_s, "health": health,
                     "statuses": [status for status, _, _ in answers],
                     "texts": sorted({a[2]["choices"][0]["text"] for a in answers
                                      if a[0] == 200}),
                     "per_engine": requests_per_engine(server),
                     "engine_actors": len(engine_actor_pids())}
            server.proc.send_signal(signal.SIGTERM)
            found["exit_code"] = server.proc.wait(60)
            deadline = time.monotonic() + RELEASE_TIMEOUT_S
            while engine_actor_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            found["actors_after"] = len(engine_actor_pids())
            return found
        finally:
            server.stop()


def engine_actor_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith("ray::EngineActor")]


def actor_pids() -> list[int]:
    """The processes of live RayWorker actors (Ray titles them ``ray::RayWorker``); in this
    PID namespace, only this cluster's."""
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith("ray::RayWorker")]


def hold(model: str) -> None:
    """(The child of ``engine_killed``.) A ray TP=2 engine, held until this process dies."""
    make_llm(model, distributed_executor_backend="ray", tensor_parallel_size=2)
    print(HELD, flush=True)
    time.sleep(HOLD_S)


def released(num_cpus: int) -> dict[str, Any]:
    """Join the cluster to see that the engines left nothing reserved."""
    ray.init(address="auto")
    try:
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        while (ray.available_resources().get("CPU", 0) < num_cpus
               and time.monotonic() < deadline):
            time.sleep(0.2)
        groups = ray.util.placement_group_table().values()
        return {"free_cpus": ray.available_resources().get("CPU", 0),
                "placement_groups": [group["state"] for group in groups]}
    finally:
        ray.shutdown()


def main() -> None:
    if sys.argv[1:2] == [HOLD]:
        hold(sys.argv[2])
        return
    rng = np.random.default_rng(draw_seed())
    seed = int(rng.integers(1 << 30))
    results: dict[str, Any] = {"seed": seed}
    with tempfile.TemporaryDirectory(prefix="ray-llama-") as folder, private_ray_tmpdir():
        save_tiny_model("llama", Path(folder), seed, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=8)
        run_checks(folder, random_prompts(rng, 4), results)
    report(results)


def run_checks(model: str, prompts: list[list[int]], results: dict[str, Any]) -> None:
    results["no_cluster"] = guarded(refused, model=model, distributed_executor_backend="ray",
                                    tensor_parallel_size=2)
    with local_ray_cluster(num_nodes=2, cpus_per_node=1) as cluster:
        results["cluster"] = {"up_s": cluster.seconds, "node_ids": cluster.node_ids}
        results["tp2"] = guarded(on_ray_and_mp, model, prompts, tensor_parallel_size=2)
        results["pp2"] = guarded(on_ray_and_mp, model, prompts, pipeline_parallel_size=2)
        results["start_fails"] = guarded(start_fails, model)
        results["kill"] = guarded(kill_one_actor, model, prompts)
        results["engine_killed"] = guarded(engine_killed, model)
        results["too_few_cpus"] = guarded(refused, model=model,
                                          distributed_executor_backend="ray",
                                          tensor_parallel_size=4)
        results["serve_dp2"] = guarded(serve_on_ray, model)
        results["released"] = guarded(released, 2)


if __name__ == "__main__":
    main()
