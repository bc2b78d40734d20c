"""Writing this step's K and V into the paged cache, in place: a Pallas kernel that issues one
HBM-to-HBM DMA per real token into its slot, the cache aliased input to output so that under
buffer donation no copy of the cache is made."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .interpret import interpret_params
from .validation import check_write_inputs


def _write_kv_kernel(slot_ref, num_tokens_ref, new_kv_hbm, cache_in_hbm, cache_out_hbm, sem):
    """Start every token's copy, then wait for all: the copies go to distinct slots, so they
    may run concurrently."""
    del cache_in_hbm  # the same buffer as cache_out_hbm (input_output_aliases)
    page_size = cache_out_hbm.shape[1]

    def copy(t):
        slot = slot_ref[t]  # non-negative: lax.div/rem avoid floor-division sign ops
        dst = cache_out_hbm.at[lax.div(slot, page_size), lax.rem(slot, page_size)]
        return pltpu.make_async_copy(new_kv_hbm.at[t], dst, sem)

    num_tokens = num_tokens_ref[0]
    lax.fori_loop(0, num_tokens, lambda t, c: (copy(t).start(), c)[1], 0)
    lax.fori_loop(0, num_tokens, lambda t, c: (copy(t).wait(), c)[1], 0)


@functools.partial(jax.jit, static_argnames=("interpret",))
def write_kv(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array,
             num_tokens: jax.Array, *,
             interpret: bool | pltpu.InterpretParams = False) -> jax.Array:
    """``kv_cache`` with row ``t < num_tokens[0]`` of k and v (``[T, num_kv_heads, head_dim]``)
    stored at slot ``slot_mapping[t]`` (``page * page_size + offset``), K heads at even and V
    heads at odd combined-head indices; rows from ``num_tokens`` on are padding and are not
    written. Slots of real rows must be distinct and inside the cache. Donate kv_cache
    (``jax.jit(..., donate_argnums=...)`` in the caller) for the update to happen in place."""
    check_write_inputs(kv_cache, k, v, slot_mapping, num_tokens)
    num_rows, num_kv_heads, head_dim = k.shape
    new_kv = jnp.stack([k, v], axis=2).reshape(num_rows, 2 * num_kv_heads, head_dim)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        _write_kv_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(1,),
            in_specs=[any_spec, any_spec],
            out_specs=any_spec,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        ),
        out_shape=jax.ShapeDtypeStruct(kv_cache.shape, kv_cache.dtype),
        input_output_aliases={3: 0},  # operands: slot_mapping, num_tokens, new_kv, kv_cache
        interpret=interpret_params(interpret),
        name="octavo_write_kv",
    )(slot_mapping, num_tokens, new_kv.astype(kv_cache.dtype), kv_cache)
