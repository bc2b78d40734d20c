"""The whole engine on the Triton kernels (``--attention-backend triton``; on the CPU under
the interpreter): a tiny model gives the same greedy tokens as with the portable torch
backend and layers.

The model's norm, rotary and activation layers are switched onto their kernels as the GPU
worker does, so every kernel runs inside real steps: prompts chunked over their cached
prefix (a small token budget), mixed prefill + decode batches, prefix-cache hits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from octavo import LLM, SamplingParams
from octavo.models.layers.rotary import ScaledRotaryEmbedding
from octavo.testing.seeds import draw_seed
from octavo_triton.layers import TritonRMSNorm, TritonRotaryEmbedding, use_triton_layers
from tests.core.arch_parity import save_hf_model
from tests.core.models.test_deepseek_v2 import MODELS as DEEPSEEK_V2
from tests.core.tiny_models import save_tiny_model

from .helpers import DEVICE

SHARED_PREFIX = list(range(40, 60))
PROMPTS = [list(range(10, 15)), list(range(100, 123)), SHARED_PREFIX + [7, 8, 9],
           list(range(200, 240)), SHARED_PREFIX + [3]]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def generate(folder: Path, attention_backend: str, kv_cache_dtype: str = "auto",
             prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    """Greedy tokens of PROMPTS: with "torch", the portable engine on the CPU (the
    reference); with "triton", the kernels on this machine's device (the GPU worker
    switches the layers itself; on the CPU they are switched here)."""
    on_kernels = attention_backend == "triton"
    backend = "cuda" if on_kernels and DEVICE.type == "cuda" else "cpu"
    llm = LLM(model=str(folder), dtype="float32", kv_cache_memory=2**20,
              max_num_batched_tokens=32, attention_backend=attention_backend, backend=backend,
              kv_cache_dtype=kv_cache_dtype)
    if on_kernels:
        model = llm.llm_engine.core.executor.worker.runner.model
        use_triton_layers(model)
        assert any(isinstance(m, TritonRMSNorm) for m in model.modules())
        assert any(isinstance(m, TritonRotaryEmbedding | ScaledRotaryEmbedding)
                   for m in model.modules())
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


# qwen3: GQA, per-head q/k norms, head_dim 32 != hidden/heads; mistral: a sliding window of
# 8 tokens, shorter than most contexts here.
@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_same_greedy_tokens_as_torch_backend(tmp_path: Path, arch: str) -> None:
    seed = draw_seed()
    save_tiny_model(arch, tmp_path, seed)
    want = generate(tmp_path, "torch")
    got = generate(tmp_path, "triton")
    assert got == want, f"{arch} seed {seed}"


def test_fp8_kv_cache_same_greedy_tokens_as_torch_backend(tmp_path: Path) -> None:
    """--kv-cache-dtype fp8 (e4m3, scales 1.0): the Triton write stores the bytes torch's
    conversion does and attention reads them back, so both backends attend the same keys
    and values (fp32 model) and pick the same tokens. Three prompts, for time: a chunked
    one, and two sharing a prefix (a prefix-cache hit)."""
    seed = draw_seed()
    save_tiny_model("qwen3", tmp_path, seed)
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[4]]
    want = generate(tmp_path, "torch", "fp8", prompts)
    got = generate(tmp_path, "triton", "fp8", prompts)
    assert got == want, f"qwen3 fp8 KV seed {seed}"


def test_latent_attention_same_greedy_tokens_as_torch_backend(tmp_path: Path) -> None:
    """DeepSeek-V2's latent attention on the paged kernel (absorbed queries over the latent
    rows): prompt chunks, decodes and prefix hits as above."""
    seed = draw_seed()
    save_hf_model(DEEPSEEK_V2["deepseek_v2"], tmp_path, seed)
    want = generate(tmp_path, "torch")
    got = generate(tmp_path, "triton")
    assert got == want, f"deepseek_v2 seed {seed}"


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the interpreter is for machines without GPU")
def test_cpu_without_interpreter_says_what_to_set(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path, 0)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "octavo", "generate", "hi", "--model", str(tmp_path),
         "--max-tokens", "2", "--attention-backend", "triton"],
        capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr  # a configuration that cannot run: bad input
    assert "runs on the CPU only under Triton's interpreter" in result.stderr
    assert "TRITON_INTERPRET=1" in result.stderr
