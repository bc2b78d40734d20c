"""Tensor parallelism on the ``mp`` executor (a worker process per rank, gloo on loopback):
fp32 greedy tokens identical to one rank, and the first step's logprobs within 1e-4.

The sizes cover each way heads split: query and KV heads both divisible (tiny Llama, 8 query
/ 4 KV heads, TP=2 and 4), fewer KV heads than ranks so each is replicated (tiny Qwen3 with
2 KV heads at TP=4), and the default model at TP=3 (9 heads, 3 KV heads, 576 hidden: every
split odd) on 8 prompts of the W1 workload. More ranks than cores is fine for correctness.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octavo.bench.workloads import build_workload
from octavo.models.loader import default_model_path
from octavo.testing.seeds import draw_seed

from ..core.loader_helpers import TinyGguf
from ..core.models.loader.test_gguf_quantized import UNIFORM
from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run, run_staggered

LOGPROB_TOLERANCE = 1e-4


def random_prompts(rng: np.random.Generator, count: int, vocab: int = 256) -> list[list[int]]:
    return [rng.integers(0, vocab, size=int(rng.integers(3, 40))).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def llama_8q_4kv(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("llama-8q-4kv")
    seed = draw_seed()
    save_tiny_model("llama", folder, seed, num_attention_heads=8, num_key_value_heads=4,
                    head_dim=8)
    return str(folder)


@pytest.mark.parametrize("tp", [2, 4])
def test_llama_tensor_parallel_matches_one_rank(llama_8q_4kv: str, tp: int) -> None:
    prompts = random_prompts(np.random.default_rng(draw_seed()), 6)
    with one_thread():
        reference = run(llama_8q_4kv, prompts, 24)
    parallel = run(llama_8q_4kv, prompts, 24, tensor_parallel_size=tp)
    assert parallel.tokens == reference.tokens
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_llama_tp2_with_requests_arriving_mid_decode(llama_8q_4kv: str,
                                                     async_scheduling: bool) -> None:
    """Three new requests a step while the others decode, as a server sees them: steps mix
    prompts with decodes, and requests finish three at a time. The workers' batch rows
    once came apart there (each process removed a step's finished requests in its own set
    order), so the ranks summed partial results of different requests: 6-9 of 32 prompts
    parted from one rank, by 0.1-0.4 in logprob. With async scheduling each worker process
    fills in the tokens it sampled itself (``octavo.sched.in_flight``)."""
    prompts = random_prompts(np.random.default_rng(draw_seed()), 15)
    with one_thread():
        reference, _ = run_staggered(llama_8q_4kv, prompts, 6)
    parallel, most_finished = run_staggered(llama_8q_4kv, prompts, 6, tensor_parallel_size=2,
                                            async_scheduling=async_scheduling)
    assert most_finished >= 2, "no step finished several requests: rows never moved"
    assert parallel.tokens == reference.tokens
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE


def test_replicated_kv_heads_qwen3_tp4(tmp_path: Path) -> None:
    seed = draw_seed()
    save_tiny_model("qwen3", tmp_path, seed, num_attention_heads=8, num_key_value_heads=2)
    prompts = random_prompts(np.random.default_rng(seed), 6)
    with one_thread():
        reference = run(str(tmp_path), prompts, 24)
    parallel = run(str(tmp_path), prompts, 24, tensor_parallel_size=4)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE


def test_quantized_gguf_tp2_matches_one_rank(tmp_path: Path) -> None:
    """A GGUF kept in its blocks (Q4_1, a Q8_0 embedding): each rank holds its rows, or its
    whole blocks of each row, and the tokens are one rank's."""
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    path = tmp_path / "tiny.gguf"
    TinyGguf(types=UNIFORM).write(path, rng)
    prompts = random_prompts(rng, 4)
    with one_thread():
        reference = run(str(path), prompts, 4, max_model_len=128, quantization="gguf")
    parallel = run(str(path), prompts, 4, tensor_parallel_size=2, max_model_len=128,
                   quantization="gguf")
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    # Random blocks make large weights: logprobs reach ~1e2 (seed 963856819: 116), where
    # fp32 rounding of the ranks' split sums is ~1e-4 (that seed: 3.8e-4); bounded relative.
    largest = max(abs(lp) for prompt in reference.prompt_logprobs for position in prompt
                  for lp in position.values())
    assert max_logprob_gap(parallel, reference) < 1e-5 * largest, f"seed {seed}"


def test_default_model_tp3_on_w1_prompts() -> None:
    """Dense (--quantization none): the portable quantized layers would make its 64 steps
    minutes long; the quantized split is the test above's."""
    prompts = build_workload("W1_throughput").prompts[:8]
    model = str(default_model_path())
    with one_thread():
        reference = run(model, prompts, 32, quantization="none")
    parallel = run(model, prompts, 32, tensor_parallel_size=3, quantization="none")
    assert parallel.tokens == reference.tokens
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE
