"""The NKI kernels (octavo_neuron.kernels), run in the NKI emulator, against the torch
layers they replace, in fp32 and bf16, from fresh random inputs (seeds in the messages).

Tolerances: the elementwise kernels round where their reference rounds, so they differ only
by float32 op order: fp32 1e-5 (abs and rel), bf16 one bf16 ulp (rel 1/64, abs 1e-2).
Attention is held to the fp64 dense reference with the Triton kernels' bounds: fp32 2e-5,
bf16 2.5e-2 absolute (probabilities are rounded to bf16 before ``p @ v``, as in flash
attention).
"""

from __future__ import annotations

import pytest
import torch

from octavo.attention.torch_backend import write_kv as reference_write_kv
from octavo.models.config import RopeConfig
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.testing.seeds import draw_seed
from octavo_neuron.kernels import (
    paged_attention,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv,
)

from ..attention_cases import (
    DECODE_BATCH,
    MIXED_BATCH,
    NUM_KV_HEADS,
    dense_reference,
    make_case,
)

DTYPES = [torch.float32, torch.bfloat16]
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5},
             torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2}}
ATTENTION_ATOL = {torch.float32: 2e-5, torch.bfloat16: 2.5e-2}
# Contexts over one 128-position K/V tile and a prompt over one 128-token query tile.
LONG_BATCH = [(250, 1), (129, 1), (140, 20), (0, 150)]


def fresh_generator() -> tuple[torch.Generator, int]:
    seed = draw_seed()
    return torch.Generator().manual_seed(seed), seed


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, seed: int) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype],
                               msg=lambda m: f"seed {seed}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype: torch.dtype, with_residual: bool) -> None:
    gen, seed = fresh_generator()
    hidden = 96
    norm = RMSNorm(hidden, eps=1e-5)
    norm.weight.data = randn(gen, hidden, dtype=torch.float32)
    norm = norm.to(dtype)
    x = randn(gen, 2, 100, hidden, dtype=dtype)  # 200 rows: one full tile, one partial
    if not with_residual:
        assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), dtype, seed)
        return
    residual = randn(gen, 2, 100, hidden, dtype=dtype)
    out, summed = rms_norm(x, norm.weight, norm.eps, residual)
    want_out, want_summed = norm(x, residual)
    assert_close(out, want_out, dtype, seed)
    assert_close(summed, want_summed, dtype, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype: torch.dtype) -> None:
    gen, seed = fresh_generator()
    x = randn(gen, 130, 2 * 48, dtype=dtype) * 3
    assert_close(silu_and_mul(x), SiluAndMul()(x), dtype, seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_embedding(dtype: torch.dtype, head_dim: int) -> None:
    gen, seed = fresh_generator()
    tokens = 140
    positions = torch.randint(0, 8192, (tokens,), generator=gen)
    q = randn(gen, tokens, 4, head_dim, dtype=dtype)
    k = randn(gen, tokens, 2, head_dim, dtype=dtype)
    rope = RotaryEmbedding(head_dim, RopeConfig())
    want_q, want_k = rope(positions, q, k)
    got_q, got_k = rotary_embedding(positions, q, k, rope.inv_freq)
    assert_close(got_q, want_q, dtype, seed)
    assert_close(got_k, want_k, dtype, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_fills_exactly_the_new_slots(dtype: torch.dtype) -> None:
    _, seed = fresh_generator()
    case = make_case(MIXED_BATCH + [(0, 130)], 4, 64, 16, dtype, seed)
    want = case.kv_cache.clone()
    reference_write_kv(want[0], want[1], case.key, case.value, case.metadata.slot_mapping)
    write_kv(case.kv_cache, case.key, case.value, case.metadata.slot_mapping)
    assert torch.equal(case.kv_cache, want), f"seed {seed}"


def check_attention(batch: list[tuple[int, int]], group: int, head_dim: int,
                    dtype: torch.dtype, window: int | None = None) -> None:
    _, seed = fresh_generator()
    case = make_case(batch, group * NUM_KV_HEADS, head_dim, 16, dtype, seed)
    meta = case.metadata
    write_kv(case.kv_cache, case.key, case.value, meta.slot_mapping)
    scale = head_dim**-0.5
    got = paged_attention(case.query, case.kv_cache, meta.block_tables,
                          meta.query_start_loc_cpu, meta.seq_lens_cpu, scale, window)
    assert got.dtype == dtype and got.shape == case.query.shape
    want = dense_reference(case, batch, scale, window)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=ATTENTION_ATOL[dtype],
                               msg=lambda m: f"seed {seed}, {batch}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("batch", [DECODE_BATCH, MIXED_BATCH], ids=["decode", "prefill"])
def test_paged_attention(batch: list[tuple[int, int]], group: int, head_dim: int,
                         dtype: torch.dtype) -> None:
    """Ragged requests over shuffled blocks (noise in the blocks nobody owns): decodes, and
    prompts/chunks over a cached prefix."""
    check_attention(batch, group, head_dim, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_over_several_tiles(dtype: torch.dtype) -> None:
    check_attention(LONG_BATCH, 4, 64, dtype)


@pytest.mark.parametrize("window", [1, 20, 130])
def test_paged_attention_with_a_sliding_window(window: int) -> None:
    """Windows inside one K/V tile and across tiles; rows that see nothing of a tile."""
    check_attention(MIXED_BATCH + LONG_BATCH, 4, 64, torch.float32, window)
