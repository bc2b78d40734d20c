"""The Pallas KV-cache write (octavo_tpu.kernels.write_kv) in TPU interpret mode with the race
detector on: it stores exactly the given slots, leaves every other slot bit-identical, ignores
padding rows, and updates the cache in place under donation."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.testing.seeds import draw_seed

from .kernel_cases import RACE_CHECKED, races_found

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from octavo_tpu.kernels import write_kv  # noqa: E402

NUM_PAGES, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, ROWS = 6, 16, 2, 64, 24


def _inputs(seed: int, num_tokens: int, dtype: str):
    """Random cache and new K/V; real rows go to distinct random slots across pages, padding
    rows point at slots of real rows (and at slot 0), so a written padding row shows."""
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((NUM_PAGES, PAGE_SIZE, 2 * NUM_KV_HEADS, HEAD_DIM))
    k = rng.standard_normal((ROWS, NUM_KV_HEADS, HEAD_DIM))
    v = rng.standard_normal((ROWS, NUM_KV_HEADS, HEAD_DIM))
    slots = rng.permutation(NUM_PAGES * PAGE_SIZE)[:ROWS]
    slots[num_tokens:] = rng.choice(np.append(slots[:num_tokens], 0), ROWS - num_tokens)
    cast = jnp.dtype(dtype)
    return (np.asarray(jnp.asarray(cache, cast)), np.asarray(jnp.asarray(k, cast)),
            np.asarray(jnp.asarray(v, cast)), slots.astype(np.int32))


def _expected(cache: np.ndarray, k: np.ndarray, v: np.ndarray, slots: np.ndarray,
              num_tokens: int) -> np.ndarray:
    out = cache.copy()
    for t in range(num_tokens):
        page, offset = divmod(int(slots[t]), PAGE_SIZE)
        out[page, offset, 0::2] = k[t]
        out[page, offset, 1::2] = v[t]
    return out


@pytest.mark.parametrize(("num_tokens", "dtype"), [(17, "float32"), (ROWS, "bfloat16"),
                                                  (0, "float32")])
def test_writes_exactly_the_given_slots(num_tokens: int, dtype: str) -> None:
    seed = draw_seed()
    cache, k, v, slots = _inputs(seed, num_tokens, dtype)
    out = write_kv(jnp.asarray(cache), jnp.asarray(k), jnp.asarray(v), jnp.asarray(slots),
                   jnp.asarray([num_tokens], jnp.int32), interpret=RACE_CHECKED)
    expected = _expected(cache, k, v, slots, num_tokens)
    assert out.dtype == cache.dtype
    np.testing.assert_array_equal(np.asarray(out), expected, err_msg=f"seed={seed}")
    assert not races_found(), f"seed={seed}: the interpreter detected a data race"


def test_updates_the_donated_cache_in_place() -> None:
    seed = draw_seed()
    cache, k, v, slots = _inputs(seed, 9, "float32")
    step = jax.jit(lambda c, *a: write_kv(c, *a, interpret=RACE_CHECKED), donate_argnums=0)
    donated = jnp.asarray(cache)
    out = step(donated, jnp.asarray(k), jnp.asarray(v), jnp.asarray(slots),
               jnp.asarray([9], jnp.int32))
    assert donated.is_deleted(), "the cache buffer was not donated to the kernel"
    np.testing.assert_array_equal(np.asarray(out), _expected(cache, k, v, slots, 9),
                                  err_msg=f"seed={seed}")


def test_bad_shapes_are_named() -> None:
    cache, k, v, slots = _inputs(0, 4, "float32")
    with pytest.raises(ValueError, match="v must be"):
        write_kv(jnp.asarray(cache), jnp.asarray(k), jnp.asarray(v[:, :1]), jnp.asarray(slots),
                 jnp.asarray([4], jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="slot_mapping must be int32"):
        write_kv(jnp.asarray(cache), jnp.asarray(k), jnp.asarray(v),
                 jnp.asarray(slots, jnp.float32), jnp.asarray([4], jnp.int32), interpret=True)
