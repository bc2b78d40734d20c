"""Every shipped kernel lowers to Mosaic for TPU (``jax.export`` with ``platforms=["tpu"]``,
no TPU needed) at every shape of ``octavo_tpu.kernels.KERNEL_SHAPES``, the shapes the model
runner compiles for: a shape that cannot lower fails here, not first on a device."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from octavo_tpu.kernels import KERNEL_SHAPES, KernelShape, ragged_paged_attention, write_kv  # noqa: E402


def _attention_args(shape: KernelShape) -> tuple[jax.ShapeDtypeStruct, ...]:
    dtype, i32 = jnp.dtype(shape.dtype), jnp.int32
    return (
        jax.ShapeDtypeStruct((shape.num_tokens, shape.num_q_heads, shape.head_dim), dtype),
        jax.ShapeDtypeStruct((shape.num_pages, shape.page_size, 2 * shape.num_kv_heads,
                              shape.head_dim), dtype),
        jax.ShapeDtypeStruct((shape.max_num_seqs,), i32),
        jax.ShapeDtypeStruct((shape.max_num_seqs, shape.pages_per_seq), i32),
        jax.ShapeDtypeStruct((shape.max_num_seqs + 1,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    )


def _write_args(shape: KernelShape) -> tuple[jax.ShapeDtypeStruct, ...]:
    new = jax.ShapeDtypeStruct((shape.num_tokens, shape.num_kv_heads, shape.head_dim),
                               jnp.dtype(shape.dtype))
    cache = _attention_args(shape)[1]
    return (cache, new, new, jax.ShapeDtypeStruct((shape.num_tokens,), jnp.int32),
            jax.ShapeDtypeStruct((1,), jnp.int32))


def _assert_mosaic(exported: jax.export.Exported, kernel_name: str) -> None:
    text = exported.mlir_module()
    assert exported.platforms == ("tpu",)
    assert "tpu_custom_call" in text and kernel_name in text, "not lowered to a Mosaic kernel"


@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
def test_kernels_lower_for_tpu(shape: KernelShape) -> None:
    attention = functools.partial(ragged_paged_attention, sm_scale=shape.head_dim ** -0.5)
    exported = jax.export.export(jax.jit(attention), platforms=["tpu"])(*_attention_args(shape))
    _assert_mosaic(exported, "octavo_ragged_paged_attention")
    assert exported.out_avals[0].shape == (shape.num_tokens, shape.num_q_heads, shape.head_dim)
    exported = jax.export.export(jax.jit(write_kv, donate_argnums=0),
                                 platforms=["tpu"])(*_write_args(shape))
    _assert_mosaic(exported, "octavo_write_kv")


def test_window_and_soft_cap_lower_for_tpu() -> None:
    shape = KERNEL_SHAPES[0]
    attention = functools.partial(ragged_paged_attention, sm_scale=0.125, sliding_window=128,
                                  soft_cap=30.0)
    exported = jax.export.export(jax.jit(attention), platforms=["tpu"])(*_attention_args(shape))
    _assert_mosaic(exported, "octavo_ragged_paged_attention")
