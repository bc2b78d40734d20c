"""The Pallas ragged paged attention kernel (octavo_tpu.kernels), run on the CPU in TPU
interpret mode with the race detector on, against the dense jnp reference on fresh random
inputs (the seed is in every failure message); the reference itself against a per-token
float64 loop.

Tolerances: fp32 runs agree with the f32 reference to 2e-5 (online vs. one-shot softmax
only reorders f32 sums). bf16 runs feed the MXU bf16 probabilities and round the output to
bf16, so they get 3e-2 absolute + relative, against a reference fed the same bf16 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from octavo.testing.seeds import draw_seed

from .kernel_cases import RACE_CHECKED, make_inputs, naive_attention, races_found

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from octavo_tpu.kernels import ragged_paged_attention, ref_ragged_paged_attention  # noqa: E402

TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}


@dataclass(frozen=True)
class Case:
    """One batch layout and kernel configuration."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_kv_heads: int
    group: int
    head_dim: int
    dtype: str = "float32"
    sliding_window: int | None = None
    soft_cap: float | None = None
    num_kv_pages_per_block: int | None = 2
    num_queries_per_block: int | None = 8


CASES = {
    # Contexts end just before, on and after page boundaries (page size 16).
    "decode_only_gqa4_hd128": Case((1, 1, 1, 1, 1), (1, 16, 17, 33, 70), 2, 4, 128),
    # Whole prompts, with the per-generation default block sizes (32 queries, all 8 pages of
    # a sequence in one KV block): the third prompt straddles the two query blocks.
    "prefill_only_gqa8_hd64_default_blocks": Case((7, 16, 20), (7, 16, 20), 1, 8, 64,
                                                  num_kv_pages_per_block=None,
                                                  num_queries_per_block=None),
    # A chunked prefill (q shorter than its context), a whole prompt, decodes.
    "mixed_mha_hd64_window": Case((1, 13, 24, 1), (40, 13, 57, 9), 4, 1, 64, sliding_window=10),
    # bf16 query blocks are 16 rows (the bf16 sublane tile).
    "mixed_gqa2_hd128_bf16_window_cap": Case((3, 1, 21, 2), (35, 18, 21, 50), 2, 2, 128,
                                             "bfloat16", sliding_window=17, soft_cap=5.0,
                                             num_queries_per_block=16),
}



def _run(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    inputs = make_inputs(rng, list(case.q_lens), list(case.kv_lens),
                         num_kv_heads=case.num_kv_heads, group=case.group,
                         head_dim=case.head_dim, dtype=case.dtype)
    options = dict(sm_scale=case.head_dim ** -0.5, sliding_window=case.sliding_window,
                   soft_cap=case.soft_cap)
    out = ragged_paged_attention(*inputs.args(), **options,
                                 num_kv_pages_per_block=case.num_kv_pages_per_block,
                                 num_queries_per_block=case.num_queries_per_block,
                                 interpret=RACE_CHECKED)
    ref = ref_ragged_paged_attention(*inputs.args(), **options)
    return inputs, out, ref


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_reference(name: str) -> None:
    case, seed = CASES[name], draw_seed()
    inputs, out, ref = _run(case, seed)
    n = inputs.num_real_tokens
    assert out.shape == inputs.q.shape and out.dtype == inputs.q.dtype
    tol = TOLERANCE[case.dtype]
    np.testing.assert_allclose(np.asarray(out[:n], np.float32), np.asarray(ref[:n], np.float32),
                               atol=tol, rtol=tol, err_msg=f"{name} seed={seed}")
    assert not races_found(), f"{name} seed={seed}: the interpreter detected a data race"
    assert np.all(np.asarray(out[n:], np.float32) == 0.0), "padding rows are zeros"


def test_pages_outside_the_window_and_context_are_not_read() -> None:
    """Pages wholly before every query's window and pool pages no sequence owns hold NaN: one
    read of them (even masked, as 0 * NaN) would turn outputs into NaN."""
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    case = CASES["mixed_mha_hd64_window"]  # the same compiled kernel
    window = case.sliding_window
    inputs = make_inputs(rng, [1, 10, 1], [70, 40, 9], num_kv_heads=case.num_kv_heads,
                         group=case.group, head_dim=case.head_dim, dtype=case.dtype)
    options = dict(sm_scale=case.head_dim ** -0.5, sliding_window=window, soft_cap=None)
    ref = ref_ragged_paged_attention(*inputs.args(), **options)
    cache = np.asarray(inputs.kv_cache).copy()
    needed = set()
    cu = np.asarray(inputs.cu_q_lens)
    for s, pages in enumerate(inputs.used_pages):
        q_len, kv_len = int(cu[s + 1] - cu[s]), int(inputs.kv_lens[s])
        first_key = max(0, kv_len - q_len - window + 1)
        needed |= set(pages[first_key // 16:])
    skipped = [p for p in range(cache.shape[0]) if p not in needed]
    assert len(skipped) > cache.shape[0] // 2
    cache[skipped] = np.nan
    inputs.kv_cache = jnp.asarray(cache)
    out = ragged_paged_attention(*inputs.args(), **options, num_kv_pages_per_block=2,
                                 num_queries_per_block=8, interpret=RACE_CHECKED)
    n = inputs.num_real_tokens
    np.testing.assert_allclose(np.asarray(out[:n]), np.asarray(ref[:n]), atol=2e-5, rtol=2e-5,
                               err_msg=f"seed={seed}")
    assert not races_found()


def test_reference_matches_per_token_loop() -> None:
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    inputs = make_inputs(rng, [1, 6, 3], [20, 6, 35], num_kv_heads=2, group=2, head_dim=64,
                         dtype="float32")
    options = dict(sm_scale=0.125, sliding_window=9, soft_cap=4.0)
    ref = ref_ragged_paged_attention(*inputs.args(), **options)
    expected = naive_attention(inputs, **options)
    np.testing.assert_allclose(np.asarray(ref[:inputs.num_real_tokens]), expected,
                               atol=1e-5, rtol=1e-5, err_msg=f"seed={seed}")


@pytest.mark.parametrize(("change", "message"), [
    (dict(kv_lens=jnp.zeros(3, jnp.float32)), "kv_lens must be int32"),
    (dict(cu_q_lens=jnp.zeros(3, jnp.int32)), "cu_q_lens must have shape (7,)"),
    (dict(q=jnp.zeros((4, 3, 64))), "num_q_heads 3 is not a multiple of num_kv_heads 2"),
    (dict(sliding_window=0), "sliding_window must be positive"),
    (dict(num_queries_per_block=12), "num_queries_per_block must be a positive multiple of 8"),
    (dict(q=jnp.zeros((4, 4, 64), jnp.bfloat16), num_queries_per_block=8),
     "multiple of 16 for bfloat16 queries"),
    (dict(num_kv_pages_per_block=9), "num_kv_pages_per_block must be in [1, 8]"),
])
def test_bad_input_is_named(change: dict, message: str) -> None:
    inputs = make_inputs(np.random.default_rng(0), [1, 2], [3, 4], num_kv_heads=2, group=2,
                         head_dim=64, dtype="float32")
    args = dict(zip(["q", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs"],
                    inputs.args()))
    kwargs = dict(sm_scale=1.0, interpret=True)
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        ragged_paged_attention(*args.values(), **kwargs)


def test_race_detector_catches_a_read_before_wait() -> None:
    """The control of every ``not races_found()`` above: a kernel that reads a DMA's
    destination before waiting for it is reported."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def racy(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        o_ref[...] = buf[...]  # races with the copy still in flight
        copy.wait()

    assert not races_found()
    pl.pallas_call(
        racy, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
        interpret=pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager"),
    )(jnp.ones((8, 128), jnp.float32)).block_until_ready()
    assert races_found()
    pltpu.reset_tpu_interpret_mode_state()
    assert not races_found()
