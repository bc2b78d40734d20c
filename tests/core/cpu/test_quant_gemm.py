"""The quantized-weight kernels (octavo.cpu.quant_gemm) against gguf's own dequantizer: for
every GGUF type they serve, fresh random blocks, odd shapes, decode and prefill row counts.

The bound: the kernels' weights are the dequantized values exactly (quant_rows is checked
bit for bit), and they sum fp32 products of fp32 activations, in any order. A dot product of
n terms summed so carries at most gamma_n * sum|x_i * w_i| of rounding error (Higham,
Accuracy and Stability of Numerical Algorithms, 3.1), gamma_n = n*u / (1 - n*u), u = 2^-24;
a bf16 result adds its own rounding, at most 2^-8 of its magnitude. A wrong block layout
moves a result by whole quantization steps, orders of magnitude above that bound.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GgmlType
from gguf.quants import dequantize as gguf_dequantize

from octavo.cpu import kernel_build, kernels, quant_gemm
from octavo.cpu.quant_gemm import quant_kernels_available, quant_matmul, quant_rows, quant_types
from octavo.models.loader import dequant as loader_dequant
from octavo.testing.gguf_blocks import SCALE_FIELDS, random_blocks
from octavo.testing.seeds import draw_seed

# Not single-threaded: the 301-row weights run on the OpenMP threads (a buffer per thread).
pytestmark = pytest.mark.skipif(not quant_kernels_available(),
                                reason="the CPU kernels' library is not built here")

OUT_FEATURES = (37, 301)  # not multiples of 16
ROWS = (1, 3, 17)  # decode kernel, decode kernel, prefill panels
U = 2.0 ** -24


def in_features_for(ggml_type: GgmlType) -> tuple[int, ...]:
    elems = GGML_QUANT_SIZES[ggml_type][0]
    return (elems, 3 * elems) if elems == 256 else (32, 160, 576)


def test_the_kernels_serve_the_listed_types_at_gguf_sizes():
    assert quant_types() == frozenset(int(t) for t in SCALE_FIELDS)
    for ggml_type in SCALE_FIELDS:
        elems, size = GGML_QUANT_SIZES[ggml_type]
        assert quant_gemm.quant_row_bytes(int(ggml_type), 3 * elems) == 3 * size


@pytest.fixture(params=["native", "x86-64-v3"])
def build(request, monkeypatch):
    """The library as this CPU builds it (AVX-512 decoders here), and as an AVX2 CPU does
    (the portable C decoders); the test_cpu_interface tests build the latter too."""
    if request.param == "native":
        return request.param
    if platform.machine() != "x86_64":
        pytest.skip("builds for an x86-64 level")
    compiler = kernel_build.compiler()
    assert compiler is not None
    flags = [f.replace("-march=native", "-march=x86-64-v3") for f in kernel_build.FLAGS]
    portable = ctypes.CDLL(str(kernel_build.built_library(compiler, flags)))
    kernels.HEADER.bind(portable)
    monkeypatch.setattr(kernels, "library", lambda: portable)
    return request.param


@pytest.mark.parametrize("ggml_type", list(SCALE_FIELDS), ids=lambda t: t.name)
def test_matmul_and_rows_match_gguf(ggml_type, build, monkeypatch):
    gen = np.random.default_rng(draw_seed())
    monkeypatch.setattr(quant_gemm, "PANEL_ELEMS", 4096)  # several panels per prefill
    for out_features in OUT_FEATURES:
        for in_features in in_features_for(ggml_type):
            if out_features * in_features > 301 * 768:
                continue
            raw = random_blocks(ggml_type, out_features, in_features, gen)
            blocks = torch.from_numpy(raw)
            weight = torch.from_numpy(gguf_dequantize(raw, ggml_type)).reshape(
                out_features, in_features)
            assert weight.dtype == torch.float32 and torch.isfinite(weight).all()
            check_rows(blocks, weight, ggml_type, gen)
            for rows in ROWS:
                check_matmul(blocks, weight, ggml_type, rows, gen)


def check_rows(blocks, weight, ggml_type, gen):
    out_features, in_features = weight.shape
    ids = torch.from_numpy(gen.integers(0, out_features, (2, 5)))
    got = quant_rows(blocks, ids, int(ggml_type), in_features, torch.float32)
    assert got.shape == (2, 5, in_features)
    assert torch.equal(got, weight[ids])
    if ggml_type in loader_dequant.BLOCK_FORMATS:  # Octavo's torch dequantizers agree too
        dense = loader_dequant.dequantize(blocks.numpy(), ggml_type, tuple(weight.shape))
        assert torch.equal(dense, weight)
    bf16 = quant_rows(blocks, ids[0], int(ggml_type), in_features, torch.bfloat16)
    assert torch.equal(bf16, weight[ids[0]].bfloat16())


def check_matmul(blocks, weight, ggml_type, rows, gen):
    out_features, in_features = weight.shape
    x = torch.from_numpy(gen.standard_normal((rows, in_features), dtype=np.float32))
    exact = x.double() @ weight.double().T
    magnitude = x.double().abs() @ weight.double().abs().T
    gamma = in_features * U / (1 - in_features * U)
    y = quant_matmul(x, blocks, int(ggml_type), out_features, in_features)
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    error = (y.double() - exact).abs()
    assert (error <= gamma * magnitude).all(), (
        f"{ggml_type.name} rows={rows} {out_features}x{in_features}: worst error "
        f"{(error / magnitude).max():.3g} x sum|xw| > gamma_n = {gamma:.3g}")
    xb = x.bfloat16()
    yb = quant_matmul(xb, blocks, int(ggml_type), out_features, in_features)
    exact_b = xb.double() @ weight.double().T
    bound = gamma * magnitude + 2.0 ** -8 * (exact_b.abs() + gamma * magnitude)
    assert yb.dtype == torch.bfloat16
    assert ((yb.double() - exact_b).abs() <= bound).all(), f"{ggml_type.name} bf16 rows={rows}"


def test_bad_inputs_are_refused_with_the_problem_named():
    gen = np.random.default_rng(draw_seed())
    blocks = torch.from_numpy(random_blocks(GgmlType.Q4_1, 4, 64, gen))
    x = torch.ones(1, 64)
    with pytest.raises(ValueError, match="Q8_1 has no quantized CPU kernel"):
        quant_matmul(x, blocks, int(GgmlType.Q8_1), 4, 64)
    with pytest.raises(ValueError, match=r"shape \[4, 40\], got \[4, 20\]"):
        quant_matmul(x, blocks[:, :20].contiguous(), int(GgmlType.Q4_1), 4, 64)
    with pytest.raises(ValueError, match="not a whole number of its blocks"):
        quant_matmul(torch.ones(1, 48), blocks, int(GgmlType.Q4_1), 4, 48)
    with pytest.raises(ValueError, match="x has 32 features"):
        quant_matmul(torch.ones(1, 32), blocks, int(GgmlType.Q4_1), 4, 64)
    with pytest.raises(IndexError, match="row id 4 is out of range for 4 rows"):
        quant_rows(blocks, torch.tensor([0, 4]), int(GgmlType.Q4_1), 64, torch.float32)
