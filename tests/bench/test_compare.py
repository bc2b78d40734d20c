"""``benchmarks/compare.py``: a reference workload (W2, the cheapest) on Octavo and HF
transformers, each job in its own process, rounds alternating, one table per workload with
Octavo's speed-up, start-up time and peak RSS. The tiny model has SmolLM2's vocabulary size,
so the workloads' prompts run on it unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as GgmlType

from octavo.bench.workloads import build_workload
from octavo.models.loader import load_model_files
from octavo.testing.seeds import draw_seed

from ..core.loader_helpers import TinyGguf, dense_weights
from .conftest import BenchModel

COMPARE = Path(__file__).resolve().parents[2] / "benchmarks" / "compare.py"
sys.path.insert(0, str(COMPARE.parent))
from compare import model_paths  # noqa: E402


def test_a_gguf_is_compared_on_its_weights_dequantized(tmp_path: Path) -> None:
    """vLLM and HF cannot read Octavo's conversion cache entry (quantized weights stay GGUF
    blocks there), so every engine loads a folder of the file's weights dequantized to fp32,
    written once."""
    seed = draw_seed()
    path = tmp_path / "tiny.gguf"
    types = {"token_embd.weight": GgmlType.Q8_0, "blk.0.attn_q.weight": GgmlType.Q4_1,
             "blk.1.ffn_down.weight": GgmlType.Q4_K}
    TinyGguf(types=types).write(path, np.random.default_rng(seed))
    folder, gguf = model_paths(str(path), tmp_path)
    assert gguf == path and folder.is_dir()
    expected = dense_weights(load_model_files(path))
    written = dict(load_model_files(folder).iter_weights())
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == torch.float32, name
        assert torch.equal(written[name], tensor.float()), f"{name} (seed {seed})"
    assert model_paths(str(path), tmp_path)[0] == folder


def test_compare_w2_octavo_and_hf(bench_model: BenchModel, tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, str(COMPARE), "--workloads", "W2", "--rounds", "2",
         "--model", str(bench_model.folder), "--engines", "octavo,hf,vllm",
         "--vllm-python", "", "--dtype", "float32", "--kv-cache-memory", "64MiB",
         "--threads", "1", "--work-dir", str(tmp_path), "--output-json", str(out),
         "--idle-timeout", "0"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "vllm skipped" in done.stdout
    data = json.loads(out.read_text())
    assert data["workloads"] == ["W2_latency"]
    assert data["threads"] == 1 and data["rounds"] == 2
    for workload in data["workloads"]:
        rows = {row["engine"]: row for row in data["tables"][workload]}
        assert set(rows) == {"octavo", "hf"}, rows
        assert rows["octavo"]["octavo speed-up"] == "1.00x"
        spec = build_workload(workload)
        runs = [r for r in data["runs"] if r["workload"] == workload]
        assert [r["label"] for r in runs] == ["octavo", "hf", "hf", "octavo"]  # alternating
        for run in runs:  # every engine did the whole workload, token for token
            assert run["num_requests"] == len(spec.prompts), run
            assert run["prompt_tokens"] == sum(len(p) for p in spec.prompts), run
            assert run["output_tokens"] == len(spec.prompts) * spec.output_len, run
            assert 0 < run["start_up_s"] < 300, run
            assert run["peak_rss"] and all(p["peak_bytes"] > 10**7 for p in run["peak_rss"])
            machine = run["machine"]  # the machine's state around the run, recorded
            assert len(machine["load_before"]) == 3 and 0 <= machine["others_cpu_share"] < 1
            assert isinstance(machine["noisy"], bool)
        assert [r["round"] for r in runs] == [0, 0, 1, 1]
        per_round = data["tables"][f"{workload} per round"]
        assert [row["round"] for row in per_round] == [1, 2]
        hf_by_round = {r["round"]: r["wall_s"] for r in runs if r["label"] == "hf"}
        octavo_by_round = {r["round"]: r["wall_s"] for r in runs if r["label"] == "octavo"}
        for row in per_round:
            ratio = hf_by_round[row["round"] - 1] / octavo_by_round[row["round"] - 1]
            assert row["vs hf"] == f"{ratio:.2f}x", row
        octavo_wall = sorted(r["wall_s"] for r in runs if r["label"] == "octavo")
        hf_wall = sorted(r["wall_s"] for r in runs if r["label"] == "hf")
        speedup = (sum(hf_wall) / 2) / (sum(octavo_wall) / 2)  # medians of two runs
        assert rows["hf"]["octavo speed-up"] == f"{speedup:.2f}x"
        assert workload in done.stdout
