"""Pipeline parallelism on the ``mp`` executor: layers split into stages, hidden states and
residuals sent between them, the last stage sampling. Greedy tokens identical to one rank;
at PP=2 the logprobs are bit-identical (each stage does the same arithmetic as the single
rank did for its layers, in another process). Tensor x pipeline (TP=2 x PP=2) too."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.bench.workloads import build_workload
from octavo.models.loader import default_model_path
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run
from .test_tensor_parallel import LOGPROB_TOLERANCE, random_prompts


@pytest.fixture(scope="module")
def default_reference() -> tuple[list[list[int]], object]:
    prompts = build_workload("W1_throughput").prompts[:4]
    with one_thread():
        return prompts, run(str(default_model_path()), prompts, 24)


@pytest.mark.parametrize("pp", [2, 3])
def test_default_model_pipeline_matches_one_rank(default_reference, pp: int) -> None:  # type: ignore[no-untyped-def]
    prompts, reference = default_reference
    staged = run(str(default_model_path()), prompts, 24, pipeline_parallel_size=pp)
    assert staged.tokens == reference.tokens
    if pp == 2:
        assert max_logprob_gap(staged, reference) == 0.0
    else:
        assert max_logprob_gap(staged, reference) < LOGPROB_TOLERANCE


def test_tensor_by_pipeline_on_tiny_llama(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seed = draw_seed()
    save_tiny_model("llama", tmp_path, seed, num_hidden_layers=4)
    prompts = random_prompts(np.random.default_rng(seed), 6)
    with one_thread():
        reference = run(str(tmp_path), prompts, 24)
    parallel = run(str(tmp_path), prompts, 24, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE
