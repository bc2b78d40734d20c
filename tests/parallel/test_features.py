"""The engine's features keep working with several workers: each run at TP=2 (and the
scheduling ones at PP=2 too) gives what one rank gives with the same settings.

- prefix caching, chunked prefill and preemption in one run (a small KV pool: the per-rank
  budget is halved with two ranks, so both runs hold the same number of blocks);
- random sampling with per-request seeds, and unseeded (every rank draws from the same
  generator state, so ranks agree), with logprobs;
- guided decoding (JSON schema, regex, choice).

Speculative decoding is refused with several workers (config/engine.py says why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import StructuredOutputsParams as S
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from ..structured.test_llm_tiny import SCHEMA
from .engines import one_thread

BLOCK_BYTES = 2 * 16 * 2 * 16 * 4 * 2  # K and V, 16 tokens, 2 KV heads of 16, fp32, 2 layers
ENGINE = dict(dtype="float32", max_model_len=160, max_num_batched_tokens=64, seed=0)


@pytest.fixture(scope="module")
def seed() -> int:
    return draw_seed()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, seed)
    return folder


def generate(folder: Path, prompts: list[Any], params: list[SamplingParams],
             blocks: int = 512, **engine: Any) -> tuple[list[Any], Any]:
    """Outputs and the scheduler's final stats of one engine (shut down after)."""
    # Each rank holds 1/ranks of every block (its heads, or its stage's layers).
    ranks = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    llm = LLM(str(folder), kv_cache_memory=blocks * BLOCK_BYTES // ranks, **ENGINE, **engine)
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return outputs, llm.llm_engine.core.scheduler.make_stats()
    finally:
        llm.shutdown()


def tokens(outputs: list[Any]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("parallel", [{"tensor_parallel_size": 2},
                                      {"pipeline_parallel_size": 2}])
def test_prefix_caching_chunked_prefill_and_preemption(tiny: Path, seed: int,
                                                       parallel: dict[str, int]) -> None:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 256, 40).tolist()
    prompts = [{"prompt_token_ids": prefix + rng.integers(0, 256, int(n)).tolist()}
               for n in rng.integers(5, 60, 8)]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * len(prompts)
    with one_thread():
        reference, _ = generate(tiny, prompts, params, blocks=12)
    outputs, stats = generate(tiny, prompts, params, blocks=12, **parallel)
    assert tokens(outputs) == tokens(reference), f"seed {seed}"
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    assert stats.prefix_cache.hits > 0


def test_seeded_and_unseeded_sampling_with_logprobs(tiny: Path, seed: int) -> None:
    prompts = [{"prompt_token_ids": list(range(10 + i, 30 + i))} for i in range(4)]
    params = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, logprobs=3,
                             seed=seed + i if i % 2 else None) for i in range(len(prompts))]
    with one_thread():
        reference, _ = generate(tiny, prompts, params)
    outputs, _ = generate(tiny, prompts, params, tensor_parallel_size=2)
    assert tokens(outputs) == tokens(reference), f"seed {seed}"
    for ours, theirs in zip(outputs, reference, strict=True):
        for mine, ref in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True):
            assert mine.keys() == ref.keys()
            assert all(abs(mine[t].logprob - ref[t].logprob) < 1e-4 for t in mine)


def test_guided_decoding(tiny: Path, seed: int) -> None:
    constraints = [S(json=SCHEMA), S(regex=r"[a-c]{2}-\d{2}"), S(choice=["left", "right"])]
    params = [SamplingParams(temperature=0, max_tokens=64, structured_outputs=c)
              for c in constraints]
    with one_thread():
        reference, _ = generate(tiny, ["abc"] * 3, params)
    outputs, _ = generate(tiny, ["abc"] * 3, params, tensor_parallel_size=2)
    assert [o.outputs[0].text for o in outputs] == [o.outputs[0].text for o in reference]
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs), f"seed {seed}"
    json.loads(outputs[0].outputs[0].text)
