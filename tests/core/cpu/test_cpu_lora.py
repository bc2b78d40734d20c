"""The CPU's C LoRA kernels (octavo.cpu.lora) against a dense float64 reference, as this CPU
builds them (AVX-512 here) and as an AVX2 CPU does (the portable loops): fresh random
inputs, ragged token -> slot maps with tokens of no adapter, odd shapes, bf16 and fp32.

The bound: each output is an fp32 sum of n products of exact inputs (bf16 values are exact
in fp32), so it carries at most gamma_n * sum|terms| of rounding error (Higham, Accuracy and
Stability of Numerical Algorithms, 3.1), gamma_n = n*u / (1 - n*u), u = 2^-24; a bf16 y adds
one rounding of the sum, at most 2^-8 of its magnitude. A token read through the wrong slot,
a dropped or doubled rank or column moves an output by whole terms, far above these bounds.
"""

from __future__ import annotations

import platform

import pytest
import torch

from octavo.cpu import kernels, lora
from octavo.cpu.platform import CpuPlatform
from octavo.lora.ops import group_tokens
from octavo.testing.seeds import draw_seed
from tests.core.cpu.avx2_build import avx2_library

pytestmark = pytest.mark.skipif(not lora.available(),
                                reason="the CPU kernels' library is not built here")

U = 2.0 ** -24
BF16_U = 2.0 ** -8

# (slot per token, slots, rank, in, size): runs of every slot, lone tokens, tokens of no
# adapter, a slot never used; one token; a rank not a multiple of the kernels' blocks with
# all tokens but one without adapter; more tokens of a slot than one run of the expand; a
# step without any adapter.
CASES = [
    ([0] * 5 + [-1] * 3 + [2] * 11 + [0] + [-1] + [2] * 16, 4, 16, 50, 70),
    ([1], 2, 8, 576, 576),
    ([-1, -1, 3, -1, -1], 4, 13, 33, 17),
    ([1] * 150 + [0] * 7 + [1] * 100, 2, 16, 64, 130),
    ([-1, -1, -1], 2, 16, 40, 24),
]


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


@pytest.fixture(params=["native", "x86-64-v3"])
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param != "native":
        if platform.machine() != "x86_64":
            pytest.skip("builds for an x86-64 level")
        portable = avx2_library()
        monkeypatch.setattr(kernels, "library", lambda: portable)
    return str(request.param)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_shrink_and_expand_match_dense_reference(build: str, dtype: torch.dtype) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    for slots_of, num_slots, rank, inp, size in CASES:
        token_lora = torch.tensor(slots_of, dtype=torch.int32)
        tokens = len(slots_of)
        groups = group_tokens(token_lora, num_slots)
        x = torch.randn(tokens, inp, generator=gen).to(dtype)
        # A slice's A of a packed layer's stack, and its B rows among the layer's.
        a = torch.randn(2, num_slots, rank, inp, generator=gen).to(dtype)[1]
        b_stack = torch.randn(num_slots, size + 9, rank, generator=gen).to(dtype)
        b = b_stack[:, 4:4 + size]
        out = torch.full((tokens, rank), float("nan"))
        lora.lora_shrink(x, a, token_lora, out, 0.5, groups)
        y = torch.randn(tokens, size + 11, generator=gen).to(dtype)
        before = y.clone()
        lora.lora_expand(y, out, b, token_lora, 6, size, groups)

        case = f"{build} seed {seed} case {slots_of[:6]}..., {tokens} tokens"
        mine = token_lora >= 0
        assert torch.all(out[~mine] == 0), f"{case}: a token of no adapter has a shrink row"
        ids = token_lora.clamp(min=0).long()
        a64, x64 = a.double()[ids], x.double()[:, None, :]  # each token's slot
        exact = 0.5 * (a64 * x64).sum(-1)
        bound = 0.5 * gamma(inp) * (a64.abs() * x64.abs()).sum(-1)
        assert torch.all((out.double() - exact).abs()[mine] <= bound[mine]), f"{case}: shrink"

        b64, buf = b.double()[ids], out.double()[:, None, :]  # the kernel's own shrink
        terms = (b64 * buf).sum(-1)
        error = gamma(rank + 1) * ((b64.abs() * buf.abs()).sum(-1)
                                   + before.double()[:, 6:6 + size].abs())
        expected = before.double()[:, 6:6 + size] + terms
        if dtype is torch.bfloat16:
            error = BF16_U * (expected.abs() + error) + error
        got = y.double()
        assert torch.equal(got[~mine], before.double()[~mine]), f"{case}: row of no adapter"
        assert torch.equal(got[:, :6], before.double()[:, :6]), f"{case}: column before"
        assert torch.equal(got[:, 6 + size:], before.double()[:, 6 + size:]), f"{case}: after"
        assert torch.all((got[:, 6:6 + size] - expected).abs()[mine] <= error[mine]), (
            f"{case}: expand")


def test_grouping_and_the_platform_hand_over() -> None:
    groups = group_tokens(torch.tensor([2, -1, 0, 2, -1, 0, 0], dtype=torch.int32), 4)
    assert groups.sorted_tokens.tolist() == [1, 4, 2, 5, 6, 0, 3]
    assert groups.counts.tolist() == [3, 0, 2, 0]
    assert groups.starts.tolist() == [2, 5, 5, 7]
    assert [(slot, rows.tolist()) for slot, rows in groups.slots()] == [(0, [2, 5, 6]),
                                                                        (2, [0, 3])]
    assert CpuPlatform.lora_kernels() == (lora.lora_shrink, lora.lora_expand)
