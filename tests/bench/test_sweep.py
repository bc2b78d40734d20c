"""``octavo bench sweep``: the roofline's arithmetic against figures worked out by hand, and
a smoke run of the command on the tiny model (two batch sizes, a PNG and the JSON)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from octavo.bench.autotune import seqs_grid_around
from octavo.bench.roofline import (
    ModelShape,
    Peaks,
    decode_step_cost,
    predict,
    saturation_batch,
)
from octavo.bench.server import ServerProcess
from octavo.bench.sweep import batch_sizes
from octavo.entrypoints.bench_cmd import auto_seqs_grid

from ..helpers import run_octavo
from .conftest import ENGINE_ARGS, PNG_MAGIC, BenchModel

# 2 layers, hidden 8, 2 query heads and 1 KV head of 4, MLP 16, vocabulary 10, tied.
TINY = ModelShape(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
                  intermediate_size=16, vocab_size=10, tied_embeddings=True)
SMOLLM2 = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
           "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
           "tie_word_embeddings": True}


def test_parameter_counts_by_hand() -> None:
    # q 8x8 + k, v 8x4 each + o 8x8 = 192; gate, up, down 8x16 each = 384.
    assert TINY.layer_matmul_params == 576
    assert TINY.matmul_params == 2 * 576 + 10 * 8  # + the LM head
    assert TINY.streamed_params == 1232 + (2 * 2 + 1) * 8  # + 5 norms of 8
    assert TINY.kv_bytes_per_token(2) == 2 * 2 * 1 * 4 * 2  # K and V, 2 layers, bf16
    assert TINY.attention_flops(5) == 4 * 2 * 2 * 4 * 5


def test_a_decode_step_by_hand() -> None:
    cost = decode_step_cost(TINY, batch_size=3, context_len=5)
    assert cost.bytes == 1272 * 2 + 3 * 5 * 32  # the weights once, each sequence's KV
    assert cost.flops == 3 * (2 * 1232 + 320)
    prediction = predict(cost, Peaks(flops_per_s=1000.0, bytes_per_s=1000.0))
    assert (prediction.memory_s, prediction.compute_s) == (3.024, 8.352)
    assert prediction.step_s == 8.352 and prediction.bound == "compute"


def test_saturation_is_where_the_two_bounds_meet() -> None:
    peaks = Peaks(flops_per_s=1e4, bytes_per_s=1e3)
    b_sat = saturation_batch(TINY, peaks, context_len=5)
    assert b_sat == pytest.approx(2544 / (2784 * 1e3 / 1e4 - 160))  # 21.49
    at = predict(decode_step_cost(TINY, b_sat, 5), peaks)  # type: ignore[arg-type]
    assert at.memory_s == pytest.approx(at.compute_s)
    # A machine so fast at arithmetic that each sequence's KV outweighs its FLOPs: never.
    assert saturation_batch(TINY, Peaks(1e12, 1.0), context_len=5) == math.inf


def test_smollm2_streams_its_269_mb_of_bf16_weights() -> None:
    shape = ModelShape.from_hf_config(SMOLLM2)
    assert shape.head_dim == 64
    assert shape.streamed_params == 134_515_008
    assert decode_step_cost(shape, 1, 0).bytes == 269_030_016


def test_batch_sizes() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    with pytest.raises(ValueError, match="--max-batch-size must be at least 1"):
        batch_sizes(0)


def test_sweep_cli_writes_table_json_and_png(bench_model: BenchModel, tmp_path: Path) -> None:
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    result = run_octavo("bench", "sweep", "--model", str(bench_model.folder), *ENGINE_ARGS,
                        "--max-batch-size", "2", "--context-len", "8", "--steps", "3",
                        "--num-iters-warmup", "0", "--num-iters", "1", "--plot", str(plot),
                        "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "roofline ms (bound)" in result.stdout and "B_sat predicted:" in result.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC
    data = json.loads(out.read_text())
    assert [p["batch_size"] for p in data["points"]] == [1, 2]
    assert all(p["step_s"] > 0 and p["over_bound"] > 0 for p in data["points"])
    assert data["peaks"]["flops_per_s"] > 0 and data["peaks"]["bytes_per_s"] > 0
    assert data["weight_bytes"] == 4  # fp32, as the model holds its projections
    assert data["points"][0]["bytes"] == decode_step_cost(
        ModelShape(**data["shape"]), 1, 8 + 3 // 2, 4, 4).bytes  # fp32: 4 bytes each


def test_the_autotune_grid_is_centred_on_b_sat(tmp_path: Path) -> None:
    assert seqs_grid_around(33.0) == [16, 32, 64]
    assert seqs_grid_around(0.3) == [1, 2]
    assert seqs_grid_around(math.inf) == [64, 256, 1024]
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps({"b_sat_observed": 8, "b_sat_predicted": 33.0}))
    assert auto_seqs_grid(None, str(saved)) == [4, 8, 16]  # the observed one first
    saved.write_text(json.dumps({"b_sat_observed": None, "b_sat_predicted": "inf"}))
    assert auto_seqs_grid(None, str(saved)) == [64, 256, 1024]


def test_sweep_against_a_server_plots_beside_a_saved_sweep(
        server: ServerProcess, bench_model: BenchModel, tmp_path: Path) -> None:
    offline, plot = tmp_path / "offline.json", tmp_path / "both.png"
    offline.write_text(json.dumps({
        "label": "saved", "shape": asdict(TINY), "context_len": 8, "steps": 3,
        "peaks": {"flops_per_s": 1e9, "bytes_per_s": 1e9}, "b_sat_predicted": 4.0,
        "points": [{"batch_size": 1, "step_s": 0.01, "tokens_per_s": 100.0}]}))
    result = run_octavo("bench", "sweep", "--base-url", server.base_url, "--shapes-from",
                        str(bench_model.folder), "--dtype-bytes", "4", "--max-batch-size", "2",
                        "--context-len", "8", "--steps", "3", "--num-iters", "1",
                        "--label", "tiny server", "--plot", str(plot),
                        "--plot-with", str(offline), "--output-json",
                        str(tmp_path / "server.json"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert plot.read_bytes()[:8] == PNG_MAGIC
    data = json.loads((tmp_path / "server.json").read_text())
    assert data["label"] == "tiny server"
    assert [p["batch_size"] for p in data["points"]] == [1, 2]
    assert all(p["step_s"] > 0 for p in data["points"])
