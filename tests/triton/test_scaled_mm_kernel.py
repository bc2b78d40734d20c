"""The fp8 and int8 (W8A8) scaled GEMMs and the per-token activation quantizer against torch:
the quantized activations bit for bit, the GEMM against the exact product of the quantized
values (fp64) scaled as the format says.

The fp8 values are torch float8_e4m3fn tensors; under the interpreter they are carried as
their bytes and widened to fp32 for the dot (octavo_triton.interpret), exactly - as a GPU
accumulates fp8 products in fp32."""

from __future__ import annotations

import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.scaled_mm import e4m3fn_to_fnuz, quantize_per_token, scaled_mm

from .helpers import DEVICE

FP8 = torch.float8_e4m3fn
RTOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def quantize_reference(x: torch.Tensor, dtype: torch.dtype,
                       scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantizer's documented rule (octavo_triton.kernels.scaled_mm) in torch."""
    qmax = 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)
    x32 = x.float()
    if scale is None:
        scale = (x32.abs().amax(1) / qmax).clamp_min(1e-12)
    v = x32 / scale.view(-1, 1)
    if dtype == torch.int8:
        v = torch.where(v >= 0, torch.floor(v + 0.5), torch.ceil(v - 0.5)).clamp(-128, 127)
    else:
        v = v.clamp(-qmax, qmax)
    return v.to(dtype), scale


@pytest.mark.parametrize(("qdtype", "dtype", "static", "per_channel", "transposed"), [
    (torch.int8, torch.bfloat16, False, True, False),
    (FP8, torch.float16, False, False, True),
    (FP8, torch.float32, True, True, False),
], ids=["int8-per-token-per-channel", "fp8-per-token-per-tensor-wT", "fp8-static-per-channel"])
def test_quantize_then_scaled_mm(qdtype: torch.dtype, dtype: torch.dtype, static: bool,
                                 per_channel: bool, transposed: bool) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    m, k, n = 19, 80, 72  # ragged against the 16/32 x 64 x 64 tiles
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    x[4] = 0  # an all-zero row: its scale stays positive and its values 0
    a_static = torch.tensor([0.05]) if static else None
    if qdtype == torch.int8:
        weight = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    else:
        weight = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(FP8)
    w_scale = torch.rand(n if per_channel else 1, generator=gen) * 0.01 + 1e-3

    want_q, want_scale = quantize_reference(x, qdtype, a_static)
    got_q, got_scale = quantize_per_token(x.to(DEVICE), qdtype,
                                          None if a_static is None else a_static.to(DEVICE))
    assert torch.equal(got_q.cpu().view(torch.uint8), want_q.view(torch.uint8)), f"seed {seed}"
    assert torch.equal(got_scale.cpu(), want_scale.float().reshape(-1)), f"seed {seed}"

    b = weight.to(DEVICE)
    if transposed:  # a checkpoint's [in, out] weight, read through a transposed view
        b = weight.T.contiguous().to(DEVICE).T
    got = scaled_mm(got_q, b, got_scale, w_scale.to(DEVICE), dtype)
    want = (want_q.double() @ weight.double().T) * want_scale.double().view(-1, 1) \
        * w_scale.double().view(1, -1)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu().double(), want, rtol=RTOL[dtype],
                               atol=RTOL[dtype] * float(want.abs().max()),
                               msg=lambda msg: f"seed {seed}: {msg}")


def test_e4m3fn_weights_as_fnuz_keep_their_values() -> None:
    """For gfx942: every e4m3fn byte but NaN, times its scale, is the same value as fnuz."""
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~weight.float().isnan()
    scale = torch.tensor([0.37])
    fnuz, fnuz_scale = e4m3fn_to_fnuz(weight, scale)
    assert fnuz.dtype == torch.float8_e4m3fnuz
    assert torch.equal(fnuz.float()[finite] * fnuz_scale, weight.float()[finite] * scale)
    assert not fnuz.float().isnan().any()  # -0 (0x80) became 0, not fnuz's NaN


def test_bad_inputs_are_named() -> None:
    a = torch.zeros(4, 32, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="one dtype"):
        scaled_mm(a, torch.zeros(8, 32, dtype=FP8, device=DEVICE), torch.ones(1),
                  torch.ones(1), torch.float16)
    with pytest.raises(ValueError, match="b_scale 3 \\(1 or 8\\)"):
        scaled_mm(a, torch.zeros(8, 32, dtype=torch.int8, device=DEVICE),
                  torch.ones(4, device=DEVICE), torch.ones(3, device=DEVICE), torch.float16)
    with pytest.raises(ValueError, match="cannot quantize activations to torch.float16"):
        quantize_per_token(torch.zeros(2, 8, device=DEVICE), torch.float16)
