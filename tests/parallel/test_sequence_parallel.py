"""Ulysses sequence parallelism on the ``mp`` executor (a worker process per rank, gloo on
loopback): fp32 greedy tokens identical to one rank, and every prompt position's top
logprobs within 1e-4, on prompts longer than 2,000 tokens.

- The default model (SmolLM2-135M: 9 query / 3 KV heads) at SP=3, in chunks of 512 tokens:
  every chunk, the last one (2 tokens) and the decode steps (1 token) do not divide by 3, so
  each is padded.
- A tiny Llama (8 query / 4 KV heads) at SP=2 x TP=2 (each rank attends with 2 query heads
  and 1 KV head): the long prompt and a short one whole in the first step (2,137 tokens,
  padded to 2,138), then decoded together.
- Heads that do not split over the ranks are refused before any worker starts (the other
  refusals: tests/core/config/test_config.py and tests/core/executor/test_model_fits.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from octavo import LLM
from octavo.bench.workloads import build_workload
from octavo.config import ConfigError
from octavo.models.loader import default_model_path
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run

LOGPROB_TOLERANCE = 1e-4
LONG_PROMPT = 2050  # tokens


def long_prompt() -> list[int]:
    """W1 prompts back to back (real text for the default model), cut at ``LONG_PROMPT``."""
    tokens = [t for prompt in build_workload("W1_throughput").prompts for t in prompt]
    assert len(tokens) >= LONG_PROMPT
    return tokens[:LONG_PROMPT]


def test_default_model_sp3_chunked_prefill() -> None:
    model = str(default_model_path())
    engine = dict(max_model_len=2304, kv_cache_memory=128 << 20, max_num_batched_tokens=512)
    prompts = [long_prompt()]
    with one_thread():
        reference = run(model, prompts, 8, **engine)
    parallel = run(model, prompts, 8, sequence_parallel_size=3, **engine)
    assert parallel.tokens == reference.tokens
    gap = max_logprob_gap(parallel, reference)
    print(f"largest logprob difference from one rank: {gap:.3g}")
    assert gap < LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def llama_8q_4kv(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("llama-8q-4kv")
    save_tiny_model("llama", folder, draw_seed(), num_attention_heads=8, num_key_value_heads=4,
                    head_dim=8, max_position_embeddings=4096)
    return str(folder)


def test_tiny_llama_sp2_tp2(llama_8q_4kv: str) -> None:
    rng = np.random.default_rng(draw_seed())
    prompts = [rng.integers(0, 256, size=size).tolist() for size in (2100, 37)]
    engine = dict(max_model_len=2304, max_num_batched_tokens=4096)
    with one_thread():
        reference = run(llama_8q_4kv, prompts, 16, **engine)
    parallel = run(llama_8q_4kv, prompts, 16, sequence_parallel_size=2, tensor_parallel_size=2,
                   **engine)
    assert parallel.tokens == reference.tokens
    gap = max_logprob_gap(parallel, reference)
    print(f"largest logprob difference from one rank: {gap:.3g}")
    assert gap < LOGPROB_TOLERANCE


def test_heads_not_divisible_are_refused(llama_8q_4kv: str) -> None:
    """Before any worker starts (the fits check; tests/core/executor/test_model_fits.py
    covers the other splits)."""
    with pytest.raises(ConfigError, match="its 4 key/value heads do not divide by "
                                          "tensor_parallel_size x sequence_parallel_size "
                                          "= 2 x 4 = 8"):
        LLM(llama_8q_4kv, dtype="float32", sequence_parallel_size=4, tensor_parallel_size=2)
