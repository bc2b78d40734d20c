"""``octavo bench serve`` and ``octavo bench autotune`` against real ``octavo serve``
processes on 127.0.0.1 with the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from octavo.bench.arrival import RampUp
from octavo.bench.autotune import GridPoint, TuneSettings, best_point, tune_point
from octavo.bench.datasets import random_requests
from octavo.bench.report import run_label
from octavo.bench.serve import ServeTarget, run_serve
from octavo.bench.server import ServerProcess
from octavo.entrypoints.cli import main
from octavo.net import free_port

from ..helpers import run_octavo
from .conftest import ENGINE_ARGS, PNG_MAGIC, BenchModel


def test_bench_serve_writes_json_and_png(server: ServerProcess, bench_model: BenchModel,
                                         tmp_path: Path) -> None:
    result_path, plot_path = tmp_path / "serve.json", tmp_path / "serve.png"
    result = run_octavo(
        "bench", "serve", "--base-url", server.base_url, "--num-prompts", "12",
        "--random-input-len", "16", "--random-output-len", "6", "--random-range-ratio", "0.25",
        "--request-rate", "30", "--request-rate", "inf", "--burstiness", "0.5",
        "--max-concurrency", "8", "--goodput", "ttft:60000", "tpot:60000", "e2el:60000",
        "--seed", str(bench_model.seed), "--save-result", str(result_path),
        "--plot", str(plot_path), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "TTFT ms (mean / median / p90 / p99)" in result.stdout
    assert "rate 30" in result.stdout and "rate inf" in result.stdout
    assert plot_path.read_bytes()[:8] == PNG_MAGIC
    data = json.loads(result_path.read_text())
    assert data["model"] == str(bench_model.folder)  # the name /v1/models lists
    assert data["goodput_slos"] == {"ttft": 60000, "tpot": 60000, "e2el": 60000}
    assert [run["request_rate"] for run in data["runs"]] == [30.0, "inf"]
    for run in data["runs"]:
        m = run["metrics"]
        assert (m["completed"], m["failed"]) == (12, 0), run["errors"]
        # ignore_eos: the server's usage counts exactly the asked lengths (4..7 tokens).
        assert all(4 <= n <= 7 for n in run["output_lens"]), run["output_lens"]
        assert m["total_output_tokens"] == sum(run["output_lens"])
        assert m["total_input_tokens"] == sum(run["input_lens"])
        assert 1 <= m["peak_concurrency"] <= 8  # --max-concurrency held
        assert m["goodput"] == pytest.approx(m["request_throughput"])  # limits generous
        for ttft, e2el, itls, n in zip(run["ttfts"], run["e2els"], run["itls"],
                                       run["output_lens"]):
            assert 0 < ttft <= e2el and len(itls) <= n - 1


def test_run_serve_in_process_and_failed_requests(server: ServerProcess,
                                                  bench_model: BenchModel) -> None:
    requests = random_requests(4, 8, 3, seed=bench_model.seed, vocab_size=259)
    target = ServeTarget(server.base_url, str(bench_model.folder))
    run = run_serve(target, requests, request_rate=50.0, seed=bench_model.seed,
                    show_progress=False)
    assert [r.success for r in run.records] == [True] * 4
    assert [r.output_len for r in run.records] == [3] * 4
    starts = [r.start for r in run.records]
    assert starts == sorted(starts) and run.duration_s >= max(starts)
    # A request the server refuses (prompt longer than the context) is a failed record,
    # and the run goes on.
    too_long = random_requests(1, 600, 3, seed=1, vocab_size=259)
    run = run_serve(target, requests[:1] + too_long, show_progress=False)
    assert [r.success for r in run.records] == [True, False]
    assert run.records[1].error.startswith("HTTP 400")


def test_ramp_up_run(server: ServerProcess, bench_model: BenchModel) -> None:
    requests = random_requests(6, 8, 2, seed=bench_model.seed, vocab_size=259)
    target = ServeTarget(server.base_url, str(bench_model.folder))
    run = run_serve(target, requests, ramp_up=RampUp("linear", 20.0, 100.0),
                    seed=bench_model.seed, show_progress=False)
    assert all(r.success for r in run.records) and run.ramp_up is not None
    assert run_label(run) == "ramp-up 20-100"


@pytest.mark.parametrize("args, says", [
    (["--goodput", "ttft:100", "itl:5"], "--goodput 'itl:5'"),
    (["stray"], "unexpected arguments: stray"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"], "--ramp-up-end-rps"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2",
      "--request-rate", "3"], "replaces --request-rate"),
    (["--metric-percentiles", "0"], "--metric-percentiles"),
])
def test_bench_serve_bad_flags_are_named(args: list[str], says: str) -> None:
    """Caught before any request is sent (the port is closed: nothing may be reached)."""
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", url, *args])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_bench_serve_unreachable_endpoint_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", url])
    assert result.exit_code == 1, result.output
    assert f"cannot reach {url}/v1/models" in result.output


def test_autotune_cli(bench_model: BenchModel, tmp_path: Path) -> None:
    """One grid point: each starts its own server, which is the slow part (the search itself
    is tested above on the shared server)."""
    out = tmp_path / "tune.json"
    result = run_octavo(
        "bench", "autotune", "--model", str(bench_model.folder),
        "--serve-args", " ".join(ENGINE_ARGS), "--max-num-seqs", "4",
        "--max-num-batched-tokens", "256", "--request-rates", "40,inf",
        "--max-latency-ms", "60000", "--num-prompts", "6", "--random-input-len", "8",
        "--random-output-len", "3", "--save-result", str(out), timeout=400)
    assert result.returncode == 0, result.stderr
    assert "best: --max-num-seqs" in result.stdout
    data = json.loads(out.read_text())
    grid = [(p["max_num_seqs"], p["max_num_batched_tokens"]) for p in data["grid"]]
    assert grid == [(4, 256)]
    for point in data["grid"]:
        # A generous limit: both rates pass and the best is the highest.
        assert [t["request_rate"] for t in point["trials"]] == [40.0, "inf"]
        assert point["best"]["request_rate"] == "inf"
    assert data["best"] is not None


def test_tune_point_stops_at_the_first_rate_over_the_limit(server: ServerProcess,
                                                           bench_model: BenchModel) -> None:
    requests = random_requests(3, 8, 2, seed=bench_model.seed, vocab_size=259)
    strict = TuneSettings(max_latency_ms=0.001, request_rates=[math.inf, 40.0, 80.0])
    point = GridPoint(256, 8192)
    tune_point(server.base_url, requests, strict, point)
    assert [t.request_rate for t in point.trials] == [40.0]  # tried lowest first, then stopped
    assert point.best is None and point.trials[0].p99_e2el_ms > 0.001
    generous = TuneSettings(max_latency_ms=60_000, request_rates=[40.0, 80.0])
    point = GridPoint(256, 8192)
    tune_point(server.base_url, requests, generous, point)
    assert [t.request_rate for t in point.trials] == [40.0, 80.0]
    assert point.best is point.trials[-1]
    assert best_point([GridPoint(1, 1), point]) is point
