"""The NKI emulator (octavo_neuron.nki_emulator): kernels that break a hardware rule fail
with an error naming the rule, the tensor and the kernel line; legal kernels compute what
NKI's semantics say. Inputs are random from seeds named in failure messages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_neuron import nki as shim
from octavo_neuron.nki_emulator import NkiRuleError, isa, jit, language

nl, nisa = language, isa
THIS_FILE = Path(__file__).resolve()


def line_of(marker: str) -> str:
    """``file:line`` of the one line of this file that ends with ``# marker``."""
    lines = THIS_FILE.read_text().splitlines()
    hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return f"{THIS_FILE}:{hits[0]}"


def fresh(*shape: int) -> tuple[np.ndarray, int]:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).numpy(), seed


def assert_rule(error: pytest.ExceptionInfo[NkiRuleError], rule: str, tensor: str,
                marker: str) -> None:
    message = str(error.value)
    assert error.value.rule == rule
    assert f"NKI rule '{rule}'" in message
    assert tensor in message, message
    assert line_of(marker) in message, message


@pytest.mark.skipif(importlib.util.find_spec("neuronxcc") is not None,
                    reason="the real NKI is installed here")
def test_the_shim_falls_back_to_the_emulator_without_neuronxcc() -> None:
    assert shim.EMULATED
    assert shim.nl is language and shim.nisa is isa and shim.nki.jit is jit


@jit
def tile_of_129_partitions(x):
    tile = nl.ndarray((129, 64), dtype=nl.float32, buffer=nl.sbuf)  # too-many-partitions
    return tile


@jit
def blocked_tile(x, partitions):
    return nl.ndarray((2, nl.par_dim(partitions), 4), dtype=nl.float32)  # par-dim-tile


@jit
def load_of_129_rows(x):
    i_p = nl.arange(129)[:, None]
    i_f = nl.arange(64)[None, :]
    return nl.load(x[i_p, i_f])  # load-of-129-rows


def test_a_tile_over_128_partitions_fails() -> None:
    x, _ = fresh(200, 64)
    with pytest.raises(NkiRuleError) as error:
        tile_of_129_partitions(x)
    assert_rule(error, "partition-dim", "[129, 64]", "too-many-partitions")
    with pytest.raises(NkiRuleError) as error:
        load_of_129_rows(x)
    assert_rule(error, "partition-dim", "[129, 64]", "load-of-129-rows")
    with pytest.raises(NkiRuleError) as error:  # kernel-output: the shape itself is legal
        blocked_tile(x, 128)
    assert error.value.rule == "kernel-output"
    with pytest.raises(NkiRuleError) as error:
        blocked_tile(x, 129)
    assert_rule(error, "partition-dim", "[2, 129, 4]", "par-dim-tile")
    assert "(axis 1) is 129 > 128" in str(error.value)


@jit
def copy_rows(x, masked):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    mask = (i_p < n) if masked else None
    tile = nl.load(x[i_p, i_f], mask=mask)  # unmasked-edge-load
    nl.store(out[i_p, i_f], tile, mask=mask)
    return out


def test_an_out_of_bounds_load_fails_unless_masked() -> None:
    x, seed = fresh(100, 32)
    with pytest.raises(NkiRuleError) as error:
        copy_rows(x, masked=False)
    assert_rule(error, "hbm-bounds", "'x' [100, 32]", "unmasked-edge-load")
    assert "axis 0 of size 100" in str(error.value)
    np.testing.assert_array_equal(copy_rows(x, masked=True), x, err_msg=f"seed {seed}")


@jit
def psum_tile(x, width):
    acc = nl.zeros((128, width), dtype=nl.float32, buffer=nl.psum)  # psum-tile
    return x if acc is None else None


def test_a_psum_tile_over_2kib_per_partition_fails() -> None:
    x, _ = fresh(4, 4)
    assert psum_tile(x, 512) is None  # fp32 [128, 512] is exactly one bank
    with pytest.raises(NkiRuleError) as error:
        psum_tile(x, 513)
    assert_rule(error, "psum-size", "[128, 513]", "psum-tile")
    assert "2052 bytes per partition > 2048" in str(error.value)


@jit
def matmul_with_hbm_operand(a, b):
    i_k = nl.arange(a.shape[0])[:, None]
    i_m = nl.arange(a.shape[1])[None, :]
    a_tile = nl.load(a[i_k, i_m])
    return nisa.nc_matmul(a_tile, b)  # hbm-operand


def test_a_matmul_operand_in_hbm_fails() -> None:
    a, _ = fresh(64, 32)
    b, _ = fresh(64, 16)
    with pytest.raises(NkiRuleError) as error:
        matmul_with_hbm_operand(a, b)
    assert_rule(error, "matmul-operand-buffer", "'b' [64, 16] float32 in HBM", "hbm-operand")


@jit
def matmul_kernel(a, b, store_psum):
    k, m = a.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    i_k = nl.arange(k)[:, None]
    a_tile = nl.load(a[i_k, nl.arange(m)[None, :]])
    b_tile = nl.load(b[nl.arange(b.shape[0])[:, None], nl.arange(n)[None, :]])
    product = nisa.nc_matmul(a_tile, b_tile)  # matmul-call
    result = product if store_psum else nl.copy(product)
    nl.store(out[nl.arange(m)[:, None], nl.arange(n)[None, :]], result)  # psum-store
    return out


def test_matmul_contracts_over_partitions_and_checks_its_shapes() -> None:
    a, seed = fresh(96, 40)
    b, _ = fresh(96, 24)
    np.testing.assert_allclose(matmul_kernel(a, b, False), a.T @ b, rtol=1e-5, atol=1e-5,
                               err_msg=f"seed {seed}")
    with pytest.raises(NkiRuleError) as error:
        matmul_kernel(a, b, True)
    assert_rule(error, "store-source", "'product/result' [40, 24] float32 in PSUM", "psum-store")
    with pytest.raises(NkiRuleError) as error:
        matmul_kernel(a, fresh(96, 513)[0], False)
    assert_rule(error, "matmul-size", "'b_tile' [96, 513]", "matmul-call")
    with pytest.raises(NkiRuleError) as error:
        matmul_kernel(a[:64], b, False)
    assert_rule(error, "matmul-contraction", "'b_tile' [96, 24]", "matmul-call")


@jit
def row_sums(x, axis):
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x[i_p, i_f])
    total = nl.sum(tile, axis=axis, keepdims=True)  # reduction
    out = nl.ndarray(total.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out[nl.arange(total.shape[0])[:, None], 0 * nl.arange(1)[None, :]], total)
    return out


def test_reductions_run_along_free_axes_only() -> None:
    x, seed = fresh(16, 48)
    np.testing.assert_allclose(row_sums(x, 1), x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5,
                               err_msg=f"seed {seed}")
    with pytest.raises(NkiRuleError) as error:
        row_sums(x, 0)
    assert_rule(error, "reduce-partition", "'tile' [16, 48]", "reduction")


@jit
def add_rows(x, y):
    i_f = nl.arange(x.shape[1])[None, :]
    a = nl.load(x[nl.arange(x.shape[0])[:, None], i_f])
    b = nl.load(y[nl.arange(y.shape[0])[:, None], i_f])
    return nl.add(a, b)  # partition-mismatch


def test_elementwise_operands_must_agree_on_partitions() -> None:
    with pytest.raises(NkiRuleError) as error:
        add_rows(fresh(8, 4)[0], fresh(1, 4)[0])
    assert_rule(error, "partition-broadcast", "'b' [1, 4]", "partition-mismatch")


@jit
def leaves_rows_unwritten(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0] // 2)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    nl.store(out[i_p, i_f], nl.load(x[i_p, i_f]))
    return out


def test_unwritten_memory_reads_as_nan() -> None:
    x, _ = fresh(8, 4)
    out = leaves_rows_unwritten(x)
    np.testing.assert_array_equal(out[:4], x[:4])
    assert np.isnan(out[4:]).all()


@jit
def scale_in_place(x, factor):
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    nl.store(x[i_p, i_f], nl.multiply(nl.load(x[i_p, i_f]), factor, dtype=x.dtype))


def test_stores_into_an_input_reach_the_callers_array_with_its_rounding() -> None:
    data, seed = fresh(8, 16)
    array = data.copy()
    scale_in_place(array, 3.0)
    np.testing.assert_allclose(array, data * 3.0, rtol=1e-6, err_msg=f"seed {seed}")
    tensor = torch.from_numpy(data).to(torch.bfloat16)
    expected = (tensor.float() * 3.0).to(torch.bfloat16)
    scale_in_place(tensor, 3.0)
    assert torch.equal(tensor, expected), f"seed {seed}"


@jit
def engine_ops(x, bias):
    p, f = x.shape
    i_p = nl.arange(p)[:, None]
    i_f = nl.arange(f)[None, :]
    tile = nl.load(x[i_p, i_f])
    bias_tile = nl.load(bias[i_p, 0 * nl.arange(1)[None, :]])
    results = [
        nisa.activation(nl.exp, tile, bias=bias_tile, scale=0.5),
        nisa.tensor_scalar(tile, nl.multiply, 2.0, op1=nl.subtract, operand1=1.0,
                           reverse1=True),
        nisa.tensor_tensor(tile, tile, nl.maximum),
        nisa.tensor_reduce(nl.maximum, tile, axis=1, keepdims=True).broadcast_to((p, f)),
        nl.copy(nisa.nc_transpose(nisa.nc_transpose(tile))),
        nl.where(i_f < i_p, tile, nisa.iota(i_p + 0 * i_f, nl.float32)),
        nl.copy(nl.matmul(tile[:, 0:p], tile)),  # x[:, :p] @ x
        nl.copy(nl.matmul(tile[:, 0:p], tile, transpose_x=True)),  # x[:, :p].T @ x
    ]
    out = nl.ndarray((len(results), p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    for n, result in enumerate(results):
        nl.store(out[n, i_p, i_f], result)
    return out


def test_engine_instructions_compute_what_nki_documents() -> None:
    x, seed = fresh(16, 24)
    bias, _ = fresh(16, 1)
    rows = np.arange(16)[:, None] + 0 * np.arange(24)[None, :]
    want = [np.exp(x * 0.5 + bias), 1.0 - x * 2.0, x,
            np.broadcast_to(x.max(1, keepdims=True), x.shape), x,
            np.where(np.arange(24)[None, :] < np.arange(16)[:, None], x, rows),
            x[:, :16] @ x, x[:, :16].T @ x]
    got = engine_ops(x, bias)
    for n, expected in enumerate(want):
        np.testing.assert_allclose(got[n], expected, rtol=1e-5, atol=1e-5,
                                   err_msg=f"seed {seed}, result {n}")


@jit
def misuses(x, what):  # kernel-output
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x[i_p, i_f])
    if what == "compute-on-hbm":
        return nl.exp(x)  # compute-on-hbm
    if what == "load-store-hbm":
        return nl.load(tile)  # load-store-hbm
    if what == "transpose-size":
        return nisa.nc_transpose(nl.zeros((8, 129), dtype=nl.float32))  # transpose-size
    if what == "sbuf-size":
        return nl.zeros((128, 49153), dtype=nl.float32)  # sbuf-size
    if what == "store-shape":
        nl.store(x[i_p, i_f], tile[:, 0:2])  # store-shape
    if what == "hbm-direct-write":
        x[i_p, i_f] = tile  # hbm-direct-write
    if what == "tile-reshape":
        return tile.reshape((4, 8))  # tile-reshape
    return tile


@pytest.mark.parametrize("rule,tensor", [
    ("compute-on-hbm", "'x' [8, 4] float32 in HBM"),
    ("load-store-hbm", "'tile' [8, 4] float32 in SBUF"),
    ("transpose-size", "tile [8, 129] float32 in SBUF"),
    ("sbuf-size", "tile [128, 49153] float32 in SBUF"),
    ("store-shape", "tile [8, 2] float32 in SBUF"),
    ("hbm-direct-write", "'x' [8, 4] float32 in HBM"),
    ("tile-reshape", "'tile' [8, 4] float32 in SBUF"),
    ("kernel-output", "tile [8, 4] float32 in SBUF"),
])
def test_misuses_name_their_rule(rule: str, tensor: str) -> None:
    """(A returned tile is found once the kernel has returned: its line is the def line.)"""
    with pytest.raises(NkiRuleError) as error:
        misuses(fresh(8, 4)[0], rule)
    assert_rule(error, rule, tensor, rule)
