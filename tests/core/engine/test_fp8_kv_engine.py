"""``--kv-cache-dtype fp8`` through the engine on a tiny random Llama: prefix caching and
preemption give the same tokens as without them, the checkpoint's per-layer scales are read,
and platforms that cannot store fp8 refuse it at start. The default model's accuracy and
block count: tests/core/engine/test_smollm2_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams
from octavo.attention.base import AttentionImpl
from octavo.config import EngineConfig
from octavo.config.errors import ConfigError
from octavo.models.loader import ModelLoadError
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

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
    llm = fp8_llm(tmp_path, dtype="bfloat16")  # the C kernels, with these scales
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
