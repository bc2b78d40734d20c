"""The ``ray`` executor on a real local Ray cluster of two raylets (one CPU each), all inside
one loopback-only network namespace (``ray_cluster``): one subprocess runs every check
(``ray_checks``, one cluster start shared by all) and reports; each test here asserts one.

The ranks of TP=2 and PP=2 land on both raylets, so their collectives run over gloo as
across machines; greedy tokens must equal ``mp``'s, and the first step's logprobs too
(within the tensor-parallel tolerance: ``mp`` all-reduces through shared memory).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from .ray_cluster import loopback_namespace_unavailable, run_in_loopback_namespace
from .test_tensor_parallel import LOGPROB_TOLERANCE

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
CHECKS_TIMEOUT_S = 200  # measured 40 s on 2 cores
NOTICE_BOUND_S = 1.0  # the executor contract: a dead worker is the engine's error within 1 s


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    why_not = loopback_namespace_unavailable()
    if why_not is not None:
        pytest.skip(f"Ray runs only inside a loopback-only network namespace, and none "
                    f"can be made here (unshare needs root): {why_not}")
    try:
        return run_in_loopback_namespace([sys.executable, "-m", "tests.parallel.ray_checks"],
                                         timeout_s=CHECKS_TIMEOUT_S, cwd=REPO)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def check(results: dict[str, Any], name: str) -> dict[str, Any]:
    found = results[name]
    assert "error" not in found, f"seed {results['seed']}:\n{found['error']}"
    return found


def test_no_cluster_is_refused_saying_how_to_start_one(results: dict[str, Any]) -> None:
    found = check(results, "no_cluster")
    assert found["refused"] is not None, "an engine started with no Ray cluster"
    assert "ray start --head" in found["refused"] and "RAY_ADDRESS" in found["refused"]
    assert found["seconds"] < 10


@pytest.mark.parametrize("sizes", ["tp2", "pp2"])
def test_ray_on_two_nodes_matches_mp(results: dict[str, Any], sizes: str) -> None:
    found = check(results, sizes)
    assert found["ray_tokens"] == found["mp_tokens"], f"seed {results['seed']}"
    assert found["logprob_gap"] < LOGPROB_TOLERANCE
    assert len(set(found["node_ids"])) == 2, "both ranks ran on one Ray node"
    assert set(found["node_ids"]) == set(results["cluster"]["node_ids"])
    assert found["left_ray"], "the engine stayed connected to Ray after its shutdown"


def test_a_rank_that_cannot_start_fails_the_engine_at_once(results: dict[str, Any]) -> None:
    found = check(results, "start_fails")
    assert found["error_text"] is not None, "the engine started"
    assert found["error_text"].startswith(
        "worker rank 1 failed to start: ValueError: OCTAVO_CPU_OMP_THREADS_BIND: worker 1 "
        "cannot run on cores [4095]"), found["error_text"]
    assert found["seconds"] < 60


def test_killed_actor_fails_the_engine_at_once(results: dict[str, Any]) -> None:
    found = check(results, "kill")
    assert len(found["reasons"]) == 1 and "worker rank 1" in found["reasons"][0]
    assert found["notice_s"] < NOTICE_BOUND_S
    assert found["other_killed"], "the surviving rank's actor was left running"
    assert found["step_error"] is not None, "a step ran with a dead worker"
    assert "worker rank 1" in found["step_error"] and found["step_s"] < NOTICE_BOUND_S


def test_actors_end_with_a_killed_engine_process(results: dict[str, Any]) -> None:
    found = check(results, "engine_killed")
    assert found["held"], "the engine to kill did not start"
    assert found["actors_before"] == 2
    assert found["actors_after"] == 0, f"actors alive {found['gone_s']:.0f} s after the kill"


def test_too_few_cpus_are_refused_with_what_there_is(results: dict[str, Any]) -> None:
    found = check(results, "too_few_cpus")
    assert found["refused"] is not None, "TP=4 started on a cluster of two CPUs"
    assert "has 2 CPU in all (2 node(s))" in found["refused"]
    assert "4 workers need 4" in found["refused"]
    assert found["seconds"] < 10


def test_serve_runs_data_parallel_engines_as_ray_actors(results: dict[str, Any]) -> None:
    found = check(results, "serve_dp2")
    print(f"\noctavo serve -dp 2 --data-parallel-backend ray: ready {found['ready_s']:.1f} s "
          f"after launch; requests per engine {found['per_engine']}")
    assert found["statuses"] == [200] * 8, found
    assert len(found["texts"]) == 1, "the two engines' greedy texts differ"
    assert found["health"]["status"] == "ok" and len(found["health"]["engines"]) == 2
    assert sorted(found["per_engine"]) == ["0", "1"] and min(found["per_engine"].values()) >= 2
    assert found["engine_actors"] == 2
    # uvicorn re-raises the signal it caught once it has shut down (as without Ray).
    assert found["exit_code"] in (0, -signal.SIGTERM), found
    assert found["actors_after"] == 0, found


def test_engines_leave_the_cluster_as_they_found_it(results: dict[str, Any]) -> None:
    found = check(results, "released")
    assert found["free_cpus"] == 2
    assert found["placement_groups"] and set(found["placement_groups"]) == {"REMOVED"}


def test_startup_overhead_is_reported(results: dict[str, Any]) -> None:
    """Cluster up -> engine ready (the issue asks for it; printed for the closing note)."""
    up_s, tp2 = results["cluster"]["up_s"], check(results, "tp2")
    print(f"\nRay cluster up (ray start -> 2 nodes alive) {up_s:.1f} s; LLM ready on ray "
          f"TP=2 {tp2['ready_s']:.1f} s (mp TP=2: {tp2['mp_ready_s']:.1f} s); cluster up "
          f"-> ready {up_s + tp2['ready_s']:.1f} s")
    assert 0 < up_s < 60 and 0 < tp2["ready_s"] < 60
