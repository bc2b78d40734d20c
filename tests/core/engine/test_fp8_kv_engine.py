"""``--kv-cache-dtype fp8`` through the engine on a tiny random Llama: prefix caching and
preemption give the same tokens as without them, the checkpoint's per-layer scales are read,
``--calculate-kv-scales`` measures them from the first prompt, and platforms that cannot
store fp8 refuse it at start. The default model's accuracy and
block count: tests/core/engine/test_smollm2_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams
from octavo.attention.base import AttentionImpl
from octavo.attention.kv_quant import V_SCALE_CONSTANT
from octavo.config import EngineConfig
from octavo.config.errors import ConfigError
from octavo.models.loader import ModelLoadError
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names
from octavo.testing.seeds import draw_seed
from tests.core.parity import ForcedRun, engine_forced_logprobs, hf_forced, mean_kl
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


# The values' projection times 2**12 and the output projection divided by it: the same model,
# its values now far past e4m3's largest (448) - what a scale of 1.0 cannot hold.
VALUE_STRETCH = 2.0**12


def test_calculated_scales_hold_values_past_the_fp8_range(tmp_path: Path) -> None:
    hf = save_tiny_model("llama", tmp_path, seed=(seed := draw_seed()))
    weights = load_file(tmp_path / "model.safetensors")
    for name in weights:
        if name.endswith(("v_proj.weight", "o_proj.weight")):
            stretch = VALUE_STRETCH if "v_proj" in name else 1 / VALUE_STRETCH
            weights[name] = weights[name] * stretch
    save_file(weights, tmp_path / "model.safetensors")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 256, n).tolist() for n in (37, 30)]
    text = [rng.integers(0, 256, 16).tolist() for _ in prompts]
    # HF fp32 forced along the same text: the model before the stretch, which is exact.
    forced = [hf_forced(hf, p, t)[1] for p, t in zip(prompts, text)]
    reference = ForcedRun([], [torch.stack(logits).log_softmax(-1) for logits in forced])
    # bf16: the C write and decode kernels, with the scales the first prompt gave.
    llm = fp8_llm(tmp_path, dtype="bfloat16", calculate_kv_scales=True,
                  enable_prefix_caching=False)
    calculated = engine_forced_logprobs(llm, prompts, text)
    scales = [(impl.k_scale, impl.v_scale) for impl in impls(llm)]
    assert not any(impl.calculate_kv_scales for impl in impls(llm))
    for impl in impls(llm):  # the same engine at vLLM's default scales, 1.0
        impl.k_scale = impl.v_scale = 1.0
    unscaled = engine_forced_logprobs(llm, prompts, text)
    llm.shutdown()
    kl = mean_kl(calculated, reference), mean_kl(unscaled, reference)
    print(f"\nseed {seed}: scales {scales}; mean KL from HF fp32: calculated {kl[0]:.2e}, "
          f"1.0 {kl[1]:.2e}")
    assert all(v > 448 / V_SCALE_CONSTANT for _, v in scales), "values past 448 / 100"
    assert kl[0] < 1e-2 < kl[1]


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
    with pytest.raises(ConfigError, match="calculate_kv_scales .* needs kv_cache_dtype fp8"):
        EngineConfig.from_kwargs(calculate_kv_scales=True)
