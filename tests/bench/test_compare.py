"""``benchmarks/compare.py``: the same reference workload on Octavo and HF transformers, each in
its own process, and one table of ratios to Octavo. The tiny model has SmolLM2's vocabulary
size, so W1's prompts run on it unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from octavo.bench.workloads import build_workload

from .conftest import BenchModel

COMPARE = Path(__file__).resolve().parents[2] / "benchmarks" / "compare.py"


def test_compare_w1_octavo_and_hf(bench_model: BenchModel, tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, str(COMPARE), "--workload", "W1_throughput",
         "--model", str(bench_model.folder), "--engines", "octavo,hf,vllm",
         "--vllm-python", "", "--kv-cache-memory", "64MiB", "--threads", "1",
         "--work-dir", str(tmp_path), "--output-json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vllm skipped" in done.stdout
    table = done.stdout[done.stdout.index("W1_throughput ("):]
    assert "vs octavo" in table and "1 thread)" in table, done.stdout
    data = json.loads(out.read_text())
    assert data["threads"] == 1
    rows = {row["engine"]: row for row in data["table"]}
    assert set(rows) == {"octavo", "hf"}
    assert rows["octavo"]["vs octavo"] == "1.00x"
    workload = build_workload("W1_throughput")
    for run in data["runs"]:  # every engine did the whole workload, token for token
        assert run["num_requests"] == 64, run
        assert run["prompt_tokens"] == sum(len(p) for p in workload.prompts), run
        assert run["output_tokens"] == 64 * 128, run
    octavo, hf = (next(r for r in data["runs"] if r["engine"] == e) for e in ("octavo", "hf"))
    ratio = (hf["output_tokens"] / hf["wall_s"]) / (octavo["output_tokens"] / octavo["wall_s"])
    assert rows["hf"]["vs octavo"] == f"{ratio:.2f}x"
