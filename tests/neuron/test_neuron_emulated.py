"""The whole engine on the Neuron platform in emulation (``OCTAVO_NEURON_EMULATE=1``): the
NKI layers and the ``nki`` attention backend, their kernels in the numpy emulator, give the
same fp32 greedy tokens as the CPU platform on tiny random models, and the worker says
which buckets a device would compile.

Each engine runs in a subprocess, as the emulation switch is read when the plugin is
imported. A small token budget chunks the longer prompts over their cached prefix and mixes
prefills with decodes; a shared prefix hits the prefix cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

SHARED_PREFIX = list(range(40, 60))
PROMPTS = [list(range(10, 15)), list(range(100, 123)), SHARED_PREFIX + [7, 8, 9],
           list(range(200, 240)), SHARED_PREFIX + [3], [5], list(range(60, 90)),
           SHARED_PREFIX + list(range(1, 12))]
ENGINE = {"dtype": "float32", "kv_cache_memory": 2**20, "max_num_batched_tokens": 48,
          "max_num_seqs": 8}
BUCKET_LINE = ("neuron: would compile 1 context-encoding buckets [48] and 4 token-generation "
               "buckets [1, 2, 4, 8] on a device")

# Greedy tokens of PROMPTS on one backend, as JSON on stdout; on neuron it also checks that
# the model runs on the NKI layers and attention.
SCRIPT = """
import json, sys
from octavo import LLM, SamplingParams
folder, backend, prompts, engine = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:])
llm = LLM(model=folder, backend=backend, **engine)
if backend == "neuron":
    from octavo_neuron.backend import NkiAttentionImpl
    from octavo_neuron.layers import NkiRMSNorm, NkiRotaryEmbedding, NkiSiluAndMul
    model = llm.llm_engine.core.executor.worker.runner.model
    kinds = {type(m) for m in model.modules()} | {type(getattr(m, "attn", None))
                                                  for m in model.modules()}
    missing = {NkiAttentionImpl, NkiRMSNorm, NkiRotaryEmbedding, NkiSiluAndMul} - kinds
    assert not missing, f"not on NKI: {missing}"
params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
print(json.dumps([list(o.outputs[0].token_ids) for o in outputs]))
"""


def emulated_env() -> dict[str, str]:
    return {**os.environ, "OCTAVO_NEURON_EMULATE": "1"}


def greedy_tokens(folder: Path, backend: str) -> tuple[list[list[int]], str]:
    """The tokens and the stderr of one engine run in a subprocess."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), backend, json.dumps(PROMPTS),
         json.dumps(ENGINE)], capture_output=True, text=True, env=emulated_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def cli_generate(folder: Path, backend: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "octavo", "generate", "the tiny model says", "--raw",
         "--model", str(folder), "--backend", backend, "--dtype", "float32",
         "--max-tokens", "8", "--kv-cache-memory", "1MiB", "--max-num-seqs", "8",
         "--max-num-batched-tokens", "48"],
        capture_output=True, text=True, env=emulated_env(), timeout=300)


@pytest.fixture(params=["llama", "qwen3"])
def tiny_model(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """llama: llama3 rope scaling; qwen3: GQA, per-head q/k norms, head_dim 32 != hidden /
    heads, tied embeddings. Fresh random weights; the seed goes into assert messages."""
    seed = draw_seed()
    save_tiny_model(request.param, tmp_path, seed)
    return tmp_path, f"{request.param} seed {seed}"


def test_same_greedy_tokens_as_cpu(tiny_model: tuple[Path, str]) -> None:
    folder, label = tiny_model
    want, _ = greedy_tokens(folder, "cpu")
    got, stderr = greedy_tokens(folder, "neuron")
    assert got == want, label
    assert stderr.count(BUCKET_LINE) == 1, stderr


def test_cli_generate_matches_cpu(tiny_model: tuple[Path, str]) -> None:
    folder, label = tiny_model
    want = cli_generate(folder, "cpu")
    got = cli_generate(folder, "neuron")
    assert want.returncode == 0, want.stderr
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout, label
    assert "platform neuron, dtype torch.float32" in got.stderr
    assert got.stderr.count(BUCKET_LINE) == 1, got.stderr


def test_plugins_command_says_emulated() -> None:
    result = subprocess.run([sys.executable, "-m", "octavo", "plugins"], capture_output=True,
                            text=True, env=emulated_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "neuron: yes (no Neuron device: NKI kernels run in the numpy emulator" in \
        result.stdout, result.stdout


def test_platform_contract_in_emulation() -> None:
    """The platform contract's checks that need the hardware (memory, ``prepare_model``
    keeping a model's outputs) skip in test_conformance.py here; in emulation they run."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         str(Path(__file__).with_name("test_conformance.py"))],
        capture_output=True, text=True, env=emulated_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped" not in result.stdout, result.stdout
