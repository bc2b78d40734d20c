"""``octavo bench latency`` and ``throughput`` on a tiny model: in process for the numbers,
through the real CLI for the flags, the JSON and the summary table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from octavo import LLM
from octavo.bench.datasets import prefix_repetition_requests, random_requests
from octavo.bench.latency import run_latency
from octavo.bench.throughput import run_throughput
from octavo.entrypoints.cli import main

from ..helpers import run_octavo
from .conftest import ENGINE_ARGS, BenchModel


@pytest.fixture(scope="module")
def llm(bench_model: BenchModel) -> LLM:
    # A small token budget: prompts are prefilled over several steps, so later requests
    # find the shared prefix already cached.
    return LLM(model=str(bench_model.folder), dtype="float32", kv_cache_memory=32 * 2**20,
               max_num_batched_tokens=64)


def test_throughput_counts_every_token(llm: LLM, bench_model: BenchModel) -> None:
    requests = prefix_repetition_requests(6, prefix_len=32, suffix_len=8, num_prefixes=1,
                                          output_len=5, seed=bench_model.seed, vocab_size=259)
    result = run_throughput(llm, requests)
    assert (result.num_requests, result.prompt_tokens, result.output_tokens) == (6, 240, 30)
    assert 0 < result.cached_prompt_tokens <= 5 * 32, f"seed={bench_model.seed}"
    assert result.prefix_cache_hit_rate == result.cached_prompt_tokens / 240
    assert result.output_tokens_per_second == pytest.approx(30 / result.elapsed_time)
    assert result.tokens_per_second == pytest.approx(270 / result.elapsed_time)


def test_latency_iterations(llm: LLM, bench_model: BenchModel) -> None:
    requests = random_requests(2, 12, 6, seed=bench_model.seed, vocab_size=259)
    result = run_latency(llm, requests, num_iters_warmup=1, num_iters=3)
    assert len(result.latencies) == len(result.ttfts) == len(result.decode_tok_per_s) == 3
    for latency, ttft, rate in zip(result.latencies, result.ttfts, result.decode_tok_per_s):
        assert 0 < ttft < latency and rate > 0
    p = result.percentiles()
    assert min(result.latencies) <= p[10] <= p[50] <= p[99] <= max(result.latencies)
    with pytest.raises(ValueError, match="--num-iters"):
        run_latency(llm, requests, 0, 0)


def test_throughput_cli_writes_json_and_table(bench_model: BenchModel, tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    result = run_octavo("bench", "throughput", "--model", str(bench_model.folder),
                        *ENGINE_ARGS, "--num-prompts", "5", "--random-input-len", "20",
                        "--random-output-len", "7", "--random-range-ratio", "0.5",
                        "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "output tokens/s" in result.stdout and "requests/s" in result.stdout
    data = json.loads(out.read_text())
    assert data["num_requests"] == 5 and data["dataset"] == "random"
    assert data["total_num_tokens"] == data["prompt_tokens"] + data["output_tokens"]
    assert data["requests_per_second"] == pytest.approx(5 / data["elapsed_time"])
    assert data["async_scheduling"] is True  # the settled default, recorded


def test_latency_cli_writes_json(bench_model: BenchModel, tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    result = run_octavo("bench", "latency", "--model", str(bench_model.folder), *ENGINE_ARGS,
                        "--batch-size", "2", "--input-len", "8", "--output-len", "4",
                        "--num-iters-warmup", "0", "--num-iters", "2", "--no-async-scheduling",
                        "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "p99 latency (s)" in result.stdout
    data = json.loads(out.read_text())
    assert data["async_scheduling"] is False
    assert len(data["latencies"]) == 2 and set(data["percentiles"]) == {
        "10", "25", "50", "75", "90", "99"}
    assert data["avg_latency"] == pytest.approx(sum(data["latencies"]) / 2)


def test_bad_dataset_flags_fail_before_loading(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")  # loading it would fail: the flags must fail first
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "throughput", "--model", missing,
                                  "--dataset-name", "sharegpt"])
    assert result.exit_code == 2
    assert "--dataset-name sharegpt needs --dataset-path" in result.output
    result = runner.invoke(main, ["bench", "throughput", "--model", missing,
                                  "--dataset-name", "lmsys"])
    assert result.exit_code == 2 and "--dataset-name must be one of" in result.output
    result = runner.invoke(main, ["bench", "latency", "--model", missing])
    assert result.exit_code == 1 and "no such file or folder" in result.output
