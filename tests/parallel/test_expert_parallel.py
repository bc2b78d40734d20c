"""Mixture of experts across tensor ranks: a tiny Mixtral with 8 experts at TP=2, with
expert parallelism (4 whole experts per rank) and without (each expert's intermediate
dimension sliced): greedy tokens identical to one rank."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run
from .test_tensor_parallel import LOGPROB_TOLERANCE, random_prompts


@pytest.mark.parametrize("expert_parallel", [True, False])
def test_mixtral_tp2_matches_one_rank(tmp_path, expert_parallel: bool) -> None:  # type: ignore[no-untyped-def]
    seed = draw_seed()
    save_tiny_model("mixtral", tmp_path, seed, num_local_experts=8)
    prompts = random_prompts(np.random.default_rng(seed), 6)
    with one_thread():
        reference = run(str(tmp_path), prompts, 24)
    parallel = run(str(tmp_path), prompts, 24, tensor_parallel_size=2,
                   enable_expert_parallel=expert_parallel)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE
