"""The quantized-weight kernels (octavo.cpu.quant_gemm) against gguf's own dequantizer: for
every GGUF type they serve, fresh random blocks, odd shapes, decode and prefill row counts.

The bound: the kernels' weights are the dequantized values exactly (quant_rows is checked
bit for bit), and they sum fp32 products of fp32 activations, in any order. A dot product of
n terms summed so carries at most gamma_n * sum|x_i * w_i| of rounding error (Higham,
Accuracy and Stability of Numerical Algorithms, 3.1), gamma_n = n*u / (1 - n*u), u = 2^-24;
a bf16 result adds its own rounding, at most 2^-8 of its magnitude, and a bf16 prefill (the
weights rounded to bf16, as a dense bf16 model's are) 2^-8 sum|x_i * w_i| more. The Q8
activations of the VNNI kernel add their own rounding (matmul_bound). A wrong block layout
moves a result by whole quantization steps, orders of magnitude above these bounds.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GgmlType
from gguf.quants import dequantize as gguf_dequantize

from octavo.cpu import kernels, quant_gemm
from octavo.cpu.quant_gemm import quant_kernels_available, quant_matmul, quant_rows, quant_types
from octavo.models.loader import dequant as loader_dequant
from octavo.testing.gguf_blocks import SCALE_FIELDS, random_blocks
from octavo.testing.seeds import draw_seed
from tests.core.cpu.avx2_build import avx2_library

# Not single-threaded: the 301-row weights run on the OpenMP threads (a buffer per thread).
pytestmark = pytest.mark.skipif(not quant_kernels_available(),
                                reason="the CPU kernels' library is not built here")

OUT_FEATURES = (37, 301)  # not multiples of 16
# decode kernel: one group of rows, two groups; prefill panels (fp32 activations) or the
# many-row VNNI kernel (Q8 ones): two tiles of 8 rows and one of 1
ROWS = (1, 3, 6, 17)
U = 2.0 ** -24
BF16_U = 2.0 ** -8  # bf16's unit roundoff (8 significant bits)


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
    portable = avx2_library()
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
                monkeypatch.setattr(quant_gemm, "Q8_ACTIVATIONS", False)
                check_matmul(blocks, weight, ggml_type, rows, gen)
                if q8_kernel_runs(ggml_type, rows):
                    monkeypatch.setattr(quant_gemm, "Q8_ACTIVATIONS", True)
                    check_matmul(blocks, weight, ggml_type, rows, gen,
                                 q8_terms(raw, weight, ggml_type))


def q8_kernel_runs(ggml_type: GgmlType, rows: int) -> bool:
    """Whether ``rows`` rows of ``ggml_type`` run a Q8-activation kernel here (with
    ``Q8_ACTIVATIONS``): the decode one, or the many-row one up to ``GEMM_Q8_ROWS``."""
    if rows <= quant_gemm.DECODE_ROWS:
        return quant_gemm.quant_q8_available(int(ggml_type))
    return (rows <= quant_gemm.GEMM_Q8_ROWS
            and quant_gemm.quant_gemm_q8_available(int(ggml_type)))


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
    panel = torch.empty((out_features, in_features), dtype=torch.bfloat16)  # bf16 prefills'
    assert kernels.library().octavo_quant_dequantize_bf16(
        panel.data_ptr(), blocks.data_ptr(), out_features, int(ggml_type), in_features) == 0
    assert torch.equal(panel, weight.bfloat16())


def q8_terms(raw: np.ndarray, weight: torch.Tensor,
             ggml_type: GgmlType) -> tuple[torch.Tensor, torch.Tensor]:
    """For the Q8-activation bound: |d q| of each weight (|w| for Q4_0, Q5_0, Q8_0 and Q6_K,
    at most |w| + |min| for Q4_1, Q5_1 and Q4_K), [out, in]; and each 32-value block's offset
    magnitude (Q4_0: 8 |d|, Q5_0: 16 |d|, Q4_1, Q5_1 and Q4_K: |min|, Q8_0 and Q6_K: 0),
    [out, blocks]."""
    size = GGML_QUANT_SIZES[ggml_type][1]
    fields = raw.reshape(raw.shape[0], -1, size)
    if ggml_type == GgmlType.Q4_K:  # the minima: the values of blocks whose qs are all 0
        no_q = fields.copy()
        no_q[..., 16:] = 0
        minimum = torch.from_numpy(gguf_dequantize(no_q.reshape(raw.shape), ggml_type))
        minimum = minimum.reshape(weight.shape[0], -1, 32)[..., 0].double().abs()
        return weight.double().abs() + minimum.repeat_interleave(32, dim=1), minimum

    def fp16_at(offset: int) -> torch.Tensor:
        return torch.from_numpy(
            fields[..., offset:offset + 2].copy().view(np.float16)[..., 0].astype(np.float64))

    w = weight.double().abs()
    if ggml_type in (GgmlType.Q4_1, GgmlType.Q5_1):
        minimum = fp16_at(2).abs()
        return w + minimum.repeat_interleave(32, dim=1), minimum
    if ggml_type in (GgmlType.Q4_0, GgmlType.Q5_0):
        return w, (8 if ggml_type == GgmlType.Q4_0 else 16) * fp16_at(0).abs()
    return w, torch.zeros((raw.shape[0], weight.shape[1] // 32), dtype=torch.float64)


def matmul_bound(x: torch.Tensor, weight: torch.Tensor,
                 q8: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """What |y - x @ weight.T| may reach, per output. fp32 products: gamma_n sum|x w|. Q8
    activations: x_i becomes q_i * dx, dx = max|x| / 127 over its block of 32, |q_i * dx -
    x_i| <= dx / 2 (+ 4u|x_i| for the fp32 scale and its reciprocal), weighted by |d q| of
    the weight (``q8_terms``); and the kernel's fp32 sums over nb blocks (nb + 40 roundings,
    with slack for the per-block sums of x), on terms at most (|w| + 2 |offset|)(|x| + dx)."""
    rows, n = x.shape
    if q8 is None:
        gamma = n * U / (1 - n * U)
        return gamma * (x.double().abs() @ weight.double().abs().T)
    dq, offset = q8
    nb = n // 32
    xb = x.double().abs().reshape(rows, nb, 32)
    dx = xb.amax(-1, keepdim=True) / 127
    act = torch.einsum("rbi,obi->ro", 0.5 * dx + 4 * U * xb, dq.reshape(-1, nb, 32))
    w = weight.double().abs().reshape(-1, nb, 32) + 2 * offset.unsqueeze(-1)
    return act + (nb + 40) * U * torch.einsum("rbi,obi->ro", xb + dx, w)


def check_matmul(blocks, weight, ggml_type, rows, gen, q8=None):
    out_features, in_features = weight.shape
    path = "q8 activations" if q8 is not None else "fp32"
    x = torch.from_numpy(gen.standard_normal((rows, in_features), dtype=np.float32))
    exact = x.double() @ weight.double().T
    bound = matmul_bound(x, weight, q8)
    y = quant_matmul(x, blocks, int(ggml_type), out_features, in_features)
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    error = (y.double() - exact).abs()
    assert (error <= bound).all(), (
        f"{ggml_type.name} {path} rows={rows} {out_features}x{in_features}: worst error "
        f"{(error / bound).max():.3g} x the bound")
    xb = x.bfloat16()
    yb = quant_matmul(xb, blocks, int(ggml_type), out_features, in_features)
    exact_b = xb.double() @ weight.double().T
    bound_b = matmul_bound(xb.float(), weight, q8)
    if rows > quant_gemm.DECODE_ROWS and q8 is None:  # bf16 panels: weights rounded first
        bound_b = (1 + BF16_U) * bound_b + BF16_U * (xb.double().abs() @ weight.double().abs().T)
    bound_b = bound_b + BF16_U * (exact_b.abs() + bound_b)  # the bf16 result's rounding
    assert yb.dtype == torch.bfloat16
    assert ((yb.double() - exact_b).abs() <= bound_b).all(), (
        f"{ggml_type.name} {path} bf16 rows={rows}")
    if q8 is not None:  # the bound is not vacuous: the rounding of x shows, and stays small
        assert 0 < error.max() and (error / exact.abs().clamp_min(1e-3)).median() < 0.05


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
    assert quant_matmul(torch.ones(2, 0, 64), blocks, int(GgmlType.Q4_1), 4, 64).shape == (2, 0, 4)
    with pytest.raises(IndexError, match="row id 4 is out of range for 4 rows"):
        quant_rows(blocks, torch.tensor([0, 4]), int(GgmlType.Q4_1), 64, torch.float32)
