"""The whole engine on the TPU backend in interpret mode (``OCTAVO_TPU_INTERPRET=1``: JAX's
CPU devices, every Pallas kernel in TPU interpret mode) gives the same fp32 greedy tokens
(and logprobs), also under penalties, logit_bias, allowed_token_ids and min_tokens, as the
torch CPU backend on tiny random Llama, Qwen3 and Mistral models,
through ``LLM(backend="tpu")`` and ``octavo generate --backend tpu``, with -tp 2 on a
two-device CPU mesh too.

The runs exercise what the worker must track (tests/tpu/engine_run.py counts it): prompts
chunked by an 8-token budget (chunks sample nothing), a shared prefix hit in the prefix
cache (new requests with computed tokens), and a KV budget of 6 blocks that preempts
requests (seen again as new, with their outputs). Every tpu run compiles its buckets
before serving and nothing after (the compile guard), and logs its start-up compile time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.tpu.engine_run import ENGINE, PROCESSED, REFUSED, kv_block_bytes
from tests.tpu.engine_run import main as run_report

ROOT = Path(__file__).parents[2]
KV_BLOCKS = 6  # fewer than the 4 running requests need at their longest: preemption
TINY_ARCHS = ("llama", "qwen3", "mistral")  # llama3 RoPE; q/k norms, tied; sliding window


def interpret_env(devices: int = 1) -> dict[str, str]:
    """The tpu runs' environment. XLA's CPU backend at optimisation level 0: interpret-mode
    programs are callbacks around small ops, which compile faster and run no slower so."""
    flags = ["--xla_backend_optimization_level=0"]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {**os.environ, "OCTAVO_TPU_INTERPRET": "1", "OMP_NUM_THREADS": "1",
            "XLA_FLAGS": " ".join(flags)}


def engine_settings(folder: Path) -> dict:
    """One step at a time: with async scheduling on (the default) these runs gave the same
    tokens and logprobs on both backends, but handed the TPU worker no request resumed
    after preemption (2026-12-07), which is what the worker must be seen to track here."""
    hf_config = json.loads((folder / "config.json").read_text())
    return {**ENGINE, "kv_cache_memory": KV_BLOCKS * kv_block_bytes(hf_config),
            "async_scheduling": False}


def engine_run(folder: Path, backend: str, tp: int = 1, sampling: bool = True,
               ) -> tuple[dict, str]:
    """The report of tests/tpu/engine_run.py for one engine, and its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.tpu.engine_run", str(folder), backend,
         json.dumps(engine_settings(folder)), str(tp), str(int(sampling))],
        capture_output=True, text=True, env=interpret_env(tp), timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@functools.cache
def cpu_reference(folder: Path, sampling: bool) -> dict:
    """The torch CPU backend's report, in this process (it needs no JAX), once a model."""
    return run_report(str(folder), "cpu", engine_settings(folder), 1, int(sampling))


def assert_same_logprobs(got: list[dict], want: list[dict], label: str) -> None:
    for got_step, want_step in zip(got, want, strict=True):
        assert got_step.keys() == want_step.keys(), label
        for token, (logprob, rank) in want_step.items():
            assert got_step[token][1] == rank, label
            np.testing.assert_allclose(got_step[token][0], logprob, rtol=1e-4, atol=1e-4)


def assert_same_run(got: dict, want: dict, label: str) -> None:
    assert got["tokens"] == want["tokens"], label
    assert_same_logprobs(got["logprobs"], want["logprobs"], label)
    if "processed_tokens" in want:
        assert_same_sampling(got, want, label)
    # The TPU worker was handed chunked prefills, prefix-cache hits and preemptions (how
    # often can differ from the CPU run on a sliding-window model: the CPU worker frees the
    # blocks that left the window, the TPU worker keeps one KV group of all blocks).
    for key in ("resumed", "prefix_hits", "chunks"):
        assert got[key] > 0, (key, got[key], want[key], label)
    assert got["compiles_while_serving"] == 0, label


def assert_same_sampling(got: dict, want: dict, label: str) -> None:
    # Penalties, logit_bias, allowed_token_ids and min_tokens: greedy, so equal tokens.
    assert got["processed_tokens"] == want["processed_tokens"], label
    assert_same_logprobs(got["processed_logprobs"], want["processed_logprobs"], label)
    bias, allowed = PROCESSED[1], PROCESSED[2]
    assert 11 not in got["processed_tokens"][1], label
    assert 3 not in got["processed_tokens"][1][:bias["min_tokens"]], label
    assert set(got["processed_tokens"][2]) <= set(allowed["allowed_token_ids"]), label
    # Seeded random sampling repeats itself; the greedy row beside it is the greedy run's.
    first, second = got["seeded_tokens"]
    assert first == second, label
    assert first[1] == got["tokens"][1][:len(first[1])], label


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """A tiny model of each architecture with fresh weights: (folder, label)."""
    models = {}
    for arch in TINY_ARCHS:
        seed = draw_seed()
        folder = tmp_path_factory.mktemp(arch)
        save_tiny_model(arch, folder, seed)
        models[arch] = folder, f"{arch} seed {seed}"
    return models


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_llm_matches_cpu(tiny_models: dict[str, tuple[Path, str]], arch: str) -> None:
    """The sampler's other paths on one architecture (and on the mesh): they do not
    depend on it."""
    folder, label = tiny_models[arch]
    sampling = arch == "llama"
    got, stderr = engine_run(folder, "tpu", sampling=sampling)
    assert_same_run(got, cpu_reference(folder, sampling), label)
    assert got["devices"] == 1
    assert "Pallas ragged paged attention on 1 cpu device(s), interpret mode" in stderr
    assert "tpu: compiled 3 step buckets (tokens [8] x requests [1, 2, 4]) in" in stderr
    assert got["startup_compile_seconds"] > 0
    if sampling:
        assert_refused_alone(got["refusals"], got["tokens"], label)


def assert_refused_alone(refusals: dict, tokens: list[list[int]], label: str) -> None:
    """Each kind the platform refuses was refused by the front end and by the core on
    arrival, for each of the three prompts, and never reached a step: the ordinary
    requests beside them all finished with the tokens they get alone."""
    for kind in (*REFUSED, "prompt_embeds"):
        said = refusals["said"][kind]
        sides = ("core",) if kind == "prompt_embeds" else ("front end", "core")
        assert len(said) == 3 * len(sides), (kind, said, label)
        for text in said:
            assert text.split(": ", 1)[0] in sides, (text, label)
            assert f"the tpu backend does not compute {kind}" in text, (text, label)
    assert refusals["finished"] == ["ordinary0", "ordinary1", "ordinary2"], label
    assert refusals["tokens"] == tokens[:3], label


def test_tensor_parallel_two_device_mesh(tiny_models: dict[str, tuple[Path, str]]) -> None:
    """-tp 2 in one worker process: heads and KV caches split over a 2-device CPU mesh
    (the llama model above, against the same CPU reference)."""
    folder, label = tiny_models["llama"]
    got, stderr = engine_run(folder, "tpu", tp=2)
    assert_same_run(got, cpu_reference(folder, True), f"{label}, tp=2")
    assert got["devices"] == 2
    assert "on 2 cpu device(s), interpret mode" in stderr
