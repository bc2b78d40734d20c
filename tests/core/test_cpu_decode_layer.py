"""Decode steps a layer per call (``octavo.cpu.decode_layer``): the same kernels in the same
order as the portable layers, so an engine with it and one without give the same tokens and
the same logprobs, on plain decode steps and on steps where many requests share a prefix
(cascade attention inside the fused call)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from octavo import LLM, SamplingParams
from octavo.cpu import decode_layer, kernels

from .tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not kernels.pair_gemm_available(),
                                 reason="the fused call needs the pair GEMM (AVX512-BF16)")]


def generate(folder: Path, shared: list[int], batches: list[list[list[int]]],
             ) -> list[tuple[list[int], list]]:
    """The outputs of each batch of prompts in turn, once ``shared`` is in the prefix cache
    (so that requests starting with it share its blocks)."""
    llm = LLM(model=str(folder), dtype="bfloat16", kv_cache_memory=16 * 2**20,
              max_num_batched_tokens=4096)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    llm.generate([{"prompt_token_ids": shared}], SamplingParams(max_tokens=1), use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for prompts in batches
            for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                  use_tqdm=False)]


def test_fused_decode_steps_match_the_layers(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    seed = random.SystemRandom().randrange(2**31)
    save_tiny_model("llama", tmp_path, seed=seed % 1000)
    rng = random.Random(seed)
    shared = [rng.randrange(256) for _ in range(300)]  # 10 requests after one long prompt
    after_shared = [shared + [rng.randrange(256) for _ in range(n)] for n in range(1, 11)]
    unrelated = [[rng.randrange(256) for _ in range(n)] for n in (5, 40, 300)]
    batches = [after_shared, unrelated]
    calls = {"layer": 0, "cascade": 0}  # layer calls, steps with a shared prefix
    decode, prefix = kernels.decode_layer, decode_layer.decode_step

    def counted_layer(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["layer"] += 1
        return decode(*args, **kwargs)

    def counted_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        step = prefix(*args, **kwargs)
        calls["cascade"] += bool(step is not None and step.prefix_len)
        return step

    monkeypatch.setattr(kernels, "decode_layer", counted_layer)
    monkeypatch.setattr(decode_layer, "decode_step", counted_step)
    fused = generate(tmp_path, shared, batches)
    assert calls["layer"] > 0 and calls["cascade"] > 0, calls
    monkeypatch.setattr(decode_layer, "use_fused_decode_layers", lambda model: 0)
    calls["layer"] = 0
    portable = generate(tmp_path, shared, batches)
    assert calls["layer"] == 0
    for i, ((tokens, logprobs), (want_tokens, want_logprobs)) in enumerate(
            zip(fused, portable)):
        assert tokens == want_tokens, f"seed={seed} request {i}"
        assert logprobs == want_logprobs, f"seed={seed} request {i}: same kernels, same bits"


def test_layers_it_cannot_run_stay_portable(tmp_path: Path) -> None:
    """Qwen3's per-head q/k norms are not in the fused call: its layers keep their path."""
    save_tiny_model("qwen3", tmp_path, seed=0)
    llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_memory=16 * 2**20)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    model = llm.llm_engine.core.executor.worker.runner.model
    layers = [m for m in model.modules() if isinstance(m, decode_layer.CpuLlamaDecoderLayer)]
    assert layers and all(layer._weights is None for layer in layers)
