"""benchmarks/gpu_check.sh and its preparation, checked here without a GPU: the check
stops at once; the prepared folder's wheels resolve Octavo for the GPU image's interpreter
(CPython 3.12) with the image's own packages standing in; the model folder, filled with
random weights as the check fills it, loads and generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from ..triton.helpers import REPO

# These check, on the CPU machine that prepares it, the GPU check itself; on a GPU machine
# (where gpu_check.sh runs tests/cuda) they would start the check again, or need network.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="a check of the GPU check, for machines without one")

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import stand_ins  # noqa: E402  (benchmarks/gpu is no package)


def test_gpu_check_stops_at_once_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=REPO,
                            env={**os.environ, "PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "no CUDA GPU" in result.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    dest = tmp_path_factory.mktemp("gpu") / "prepared"
    result = subprocess.run(["bash", "benchmarks/gpu/prepare.sh", str(dest)], cwd=REPO,
                            env={**os.environ, "PYTHON": sys.executable},
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dest, result.stdout


def test_prepared_wheels_resolve_octavo_for_the_image(prepared: tuple[Path, str]) -> None:
    dest, stdout = prepared
    assert "resolved from Octavo (3): octavo 0.1" in stdout
    carried = {path.name.split("-")[0].lower() for path in (dest / "wheels").glob("*.whl")}
    for needed in ("xgrammar", "fastapi", "uvicorn", "pydantic", "pyzmq", "msgspec", "gguf"):
        assert needed in carried, f"{needed} is not carried: {sorted(carried)}"
    assert not carried & {"torch", "triton", "numpy", "transformers"}  # the image's own
    for wheel in (dest / "wheels").glob("*.whl"):
        assert "-cp312-" in wheel.name or "-abi3-" in wheel.name or "-py3-" in wheel.name \
            or "-py2.py3-" in wheel.name, wheel.name
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert size < 48 * 2**20, f"{size / 2**20:.1f} MiB cannot travel with the tree"


def test_random_weights_fill_the_model_folder_and_load(prepared: tuple[Path, str]) -> None:
    model = prepared[0] / "model"
    config = json.loads((model / "config.json").read_text())
    assert config["hidden_size"] == 576 and (model / "tokenizer.json").exists()
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "weights", str(model)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "134.5M random bf16 parameters" in result.stdout

    from octavo import LLM, SamplingParams

    llm = LLM(model=str(model), dtype="bfloat16", kv_cache_memory="64MiB", max_model_len=512)
    outputs = llm.generate(["The capital of France is"],
                           SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 4


def test_stand_in_wheels_pin_the_image_version(tmp_path: Path) -> None:
    listing = tmp_path / "packages.txt"
    listing.write_text("torch==2.11.0  # read\n\n# comment\nclick\n")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("Click==8.5.1\ntorch==2.13.0+cpu\n-e git+https://x/y#egg=z\n")
    tested = stand_ins.read_freeze(freeze)
    assert tested == {"click": "8.5.1"}
    assert stand_ins.read_packages(listing, tested) == [("torch", "2.11.0"), ("click", "8.5.1")]
    wheel = stand_ins.write_stand_in("torch", "2.11.0", tmp_path)
    assert wheel.name == "torch-2.11.0+image-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("torch-2.11.0+image.dist-info/METADATA").decode()
    assert "Version: 2.11.0+image" in metadata and "Requires-Dist" not in metadata
    listing.write_text("torch>=2.11\n")
    with pytest.raises(SystemExit, match=r"packages.txt:1: expected name or name==version"):
        stand_ins.read_packages(listing, tested)
    listing.write_text("pluggy\n")
    with pytest.raises(SystemExit, match=r"pluggy has no version here and none in the tested"):
        stand_ins.read_packages(listing, tested)


def test_the_table_reads_what_the_check_writes(tmp_path: Path) -> None:
    """``gpu_check.py table`` over the files gpu_check.sh writes (made up here), so that its
    first run on a device does not fail on its last step."""
    (tmp_path / "tests.summary").write_text(" 120 passed in 50.0s \n")
    (tmp_path / "kernels.json").write_text(json.dumps(
        [{"kernel": "rms_norm + residual", "shape": "4096 x 4096", "triton_us": 20.0,
          "torch_us": 60.0}]))
    for mode, scale in (("graphs", 1.0), ("eager", 0.5), ("mp", 0.9)):
        (tmp_path / f"W1_throughput_{mode}.json").write_text(json.dumps(
            {"output_tokens_per_second": 4000 * scale, "tokens_per_second": 12000 * scale}))
        (tmp_path / f"W2_latency_{mode}.json").write_text(json.dumps(
            {"avg_latency": 0.5 / scale, "avg_decode_tok_per_s": 300 * scale}))
    (tmp_path / "W1_throughput_graphs.log").write_text(
        "INFO 12:00:00 gpu_worker: memory: device 139.80 GiB, weights 0.25 GiB, peak "
        "activations 0.10 GiB, non-torch 0.50 GiB; KV cache 120.00 GiB (gpu_memory_utilization"
        " 0.90)\n")
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "table", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = result.stdout
    assert "120 passed in 50.0s" in table
    assert "3.00x" in table  # rms_norm: torch 60 us / triton 20 us
    assert "4000 output tok/s" in table and "2.00x" in table  # W1 graphs vs eager
    assert "TP=1: mp executor | in-process worker" in table and "0.90x" in table
    assert "device 139.80 GiB, weights 0.25 GiB" in table


def test_the_check_script_parses() -> None:
    for script in ("benchmarks/gpu_check.sh", "benchmarks/gpu/prepare.sh"):
        result = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, f"{script}: {result.stderr}"
