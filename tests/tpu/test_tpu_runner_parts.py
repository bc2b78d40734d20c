"""The TPU runner's small parts, in process (JAX on the CPU): the step buckets, the compile
guard that the engine tests rely on to prove nothing compiles while serving, and the
platform's refusal (in the front end) of the request settings the runner does not compute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from octavo.plugin_api import Request, SamplingParams
from octavo.testing.seeds import draw_seed
from octavo_tpu.buckets import Buckets
from octavo_tpu.compile_watch import CompileGuard
from octavo_tpu.platform import TpuPlatform


def test_buckets_cover_every_step_size() -> None:
    buckets = Buckets.for_limits(max_num_batched_tokens=40, max_num_seqs=6)
    assert buckets.tokens == (8, 16, 32, 64)
    assert buckets.reqs == (1, 2, 4, 8)
    assert (8, 8) in buckets.pairs() and (8, 16) not in buckets.pairs()
    for tokens in range(1, 41):
        for reqs in range(1, min(tokens, 6) + 1):
            padded = buckets.pad(tokens, reqs)
            assert padded in buckets.pairs() and padded[0] >= tokens and padded[1] >= reqs
    with pytest.raises(ValueError, match="exceeds the largest compiled size 64"):
        buckets.pad(65, 1)


def test_guard_counts_a_compile_after_warm_up() -> None:
    guard = CompileGuard()
    rng = np.random.default_rng(draw_seed())
    shape = (int(rng.integers(3, 1000)),)  # a shape nothing has compiled for
    double = jax.jit(lambda x: x * 2)
    double(jnp.ones(1)).block_until_ready()  # warm-up: before arming, not counted
    guard.arm()
    double(jnp.ones(1)).block_until_ready()  # a cache hit
    guard.check("same shape")
    assert guard.compiles_while_serving == 0
    double(np.ones(shape, np.float32)).block_until_ready()  # a new shape: one compile
    guard.check("new shape")
    assert guard.compiles_while_serving == 1


@pytest.mark.parametrize(("params", "named"), [
    (SamplingParams(temperature=0.0, prompt_logprobs=1), "prompt_logprobs"),
    (SamplingParams(temperature=0.8, logprobs=21), "logprobs > 20"),
])
def test_unsupported_sampling_is_named(params: SamplingParams, named: str) -> None:
    with pytest.raises(ValueError, match=f"the tpu backend does not compute {named}"):
        TpuPlatform.validate_request(Request("r1", [1, 2, 3], params))
    for supported in (SamplingParams(temperature=0.8, top_p=0.9, seed=3, logprobs=20),
                      SamplingParams(presence_penalty=0.5, min_tokens=3, logit_bias={1: 2.0})):
        TpuPlatform.validate_request(Request("r2", [1, 2], supported))
