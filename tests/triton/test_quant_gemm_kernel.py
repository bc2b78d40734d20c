"""The W4A16 (AWQ, GPTQ 4- and 8-bit) GEMM against ``x @ W`` with ``W`` dequantized by a torch
reference written from each format's published layout (the module docstring of
octavo_triton.kernels.quant_gemm names them), on weights packed here by the same spec.

The kernel rounds ``W`` to ``x``'s dtype, as the reference does, so the two differ only in
the order of an fp32 sum."""

from __future__ import annotations

import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.quant_gemm import awq_gemm, default_split_k, gptq_gemm

from .helpers import DEVICE, DTYPES

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # the column stored in nibble i of a word
RTOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words of 32 bits as the int32 a checkpoint stores (two's complement)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_columns(values: torch.Tensor, bits: int, order: list[int]) -> torch.Tensor:
    """[R, C] -> [R, C*bits/32]: word j holds columns j*P + order[i] at bits*i."""
    pack = 32 // bits
    grouped = values.to(torch.int64).view(values.shape[0], -1, pack)
    words = sum(grouped[:, :, column] << (bits * i) for i, column in enumerate(order))
    return to_int32(words)


def unpack_columns(words: torch.Tensor, bits: int, order: list[int]) -> torch.Tensor:
    pack = 32 // bits
    out = torch.empty(words.shape[0], words.shape[1], pack, dtype=torch.int64)
    for i, column in enumerate(order):
        out[:, :, column] = (words.to(torch.int64) >> (bits * i)) & ((1 << bits) - 1)
    return out.view(words.shape[0], -1)


def dequantize(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
               groups: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[K, N] ``(q - z[g(k)]) * s[g(k)]`` in fp32, rounded to ``dtype``."""
    return ((q - zeros[groups]).float() * scales[groups].float()).to(dtype)


def draw(gen: torch.Generator, k: int, n: int, groups: int, bits: int, dtype: torch.dtype):
    q = torch.randint(0, 1 << bits, (k, n), generator=gen)
    zeros = torch.randint(0, 1 << bits, (groups, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.005).to(dtype)
    return q, zeros, scales


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "split_k"), [(5, None), (33, 1)], ids=["split-k", "one-split"])
def test_awq(dtype: torch.dtype, m: int, split_k: int | None) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    k, n, group = 256, 104, 64  # 104: a partial column block
    q, zeros, scales = draw(gen, k, n, k // group, 4, dtype)
    qweight, qzeros = pack_columns(q, 4, AWQ_ORDER), pack_columns(zeros, 4, AWQ_ORDER)
    assert torch.equal(unpack_columns(qweight, 4, AWQ_ORDER), q)
    weight = dequantize(unpack_columns(qweight, 4, AWQ_ORDER),
                        unpack_columns(qzeros, 4, AWQ_ORDER), scales,
                        torch.arange(k) // group, dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    want = x.double() @ weight.double()
    assert (split_k or default_split_k(m, n, k)) == (2 if split_k is None else 1)
    got = awq_gemm(x.to(DEVICE), qweight.to(DEVICE), scales.to(DEVICE),
                   qzeros.to(DEVICE), split_k=split_k)
    assert got.dtype == dtype and got.shape == (m, n)
    torch.testing.assert_close(got.cpu().double(), want, rtol=RTOL[dtype],
                               atol=RTOL[dtype] * float(want.abs().max()),
                               msg=lambda msg: f"seed {seed}: {msg}")


@pytest.mark.parametrize(("bits", "checkpoint_format", "group", "act_order", "dtype", "m"), [
    (4, "gptq", 32, True, torch.bfloat16, 3),
    (4, "gptq_v2", 32, False, torch.float32, 17),
    (8, "gptq", -1, False, torch.float16, 20),
], ids=["4bit-v1-act-order", "4bit-v2", "8bit-v1-one-group"])
def test_gptq(bits: int, checkpoint_format: str, group: int, act_order: bool,
              dtype: torch.dtype, m: int) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    k, n = 160, 72
    groups = 1 if group == -1 else k // group
    q, zeros, scales = draw(gen, k, n, groups, bits, dtype)
    if checkpoint_format == "gptq":
        # v1 stores z - 1, so it cannot hold a zero point of 0 (-1 wraps to all ones and
        # reads back as 1 << bits, in AutoGPTQ's kernels as in these): real v1 checkpoints
        # have none, and neither do the drawn ones.
        zeros = zeros.clamp(min=1)
    group_of = torch.arange(k) // (k // groups)
    if act_order:  # desc_act: the rows' groups follow a permutation of the input features
        group_of = group_of[torch.randperm(k, generator=gen)]
    sequential = list(range(32 // bits))
    stored_zeros = zeros - 1 if checkpoint_format == "gptq" else zeros
    qzeros = pack_columns(stored_zeros, bits, sequential)
    qweight = pack_columns(q.T.contiguous(), bits, sequential).T.contiguous()
    unpacked_zeros = unpack_columns(qzeros, bits, sequential)
    if checkpoint_format == "gptq":
        unpacked_zeros = unpacked_zeros + 1
    assert torch.equal(unpacked_zeros, zeros)
    weight = dequantize(unpack_columns(qweight.T.contiguous(), bits, sequential).T,
                        unpacked_zeros, scales, group_of, dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    want = x.double() @ weight.double()
    got = gptq_gemm(x.to(DEVICE), qweight.to(DEVICE), scales.to(DEVICE), qzeros.to(DEVICE),
                    group_of.to(DEVICE) if act_order else None, bits, checkpoint_format)
    torch.testing.assert_close(got.cpu().double(), want, rtol=RTOL[dtype],
                               atol=RTOL[dtype] * float(want.abs().max()),
                               msg=lambda msg: f"seed {seed}: {msg}")


def test_bad_layouts_are_named() -> None:
    x = torch.zeros(2, 64, device=DEVICE)
    scales = torch.ones(2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="AWQ: qweight is \\(64, 4\\), expected \\(64, 2\\)"):
        awq_gemm(x, torch.zeros(64, 4, dtype=torch.int32, device=DEVICE), scales,
                 torch.zeros(2, 2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="3 groups, which do not divide the 64"):
        gptq_gemm(x, torch.zeros(8, 16, dtype=torch.int32, device=DEVICE),
                  torch.ones(3, 16, device=DEVICE),
                  torch.zeros(3, 2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="3-bit"):
        gptq_gemm(x, torch.zeros(8, 16, dtype=torch.int32, device=DEVICE), scales,
                  torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), bits=3)
