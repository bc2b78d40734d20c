"""The CPU's C LoRA kernels (octavo.cpu.lora) against a dense float64 reference, as this CPU
builds them (AVX-512 and AVX512-BF16 here), as an AVX-512 CPU without AVX512-BF16 does and
as an AVX2 CPU does (the portable loops): fresh random inputs, ragged token -> slot maps
with tokens of no adapter, odd shapes, bf16 and fp32.

The bound: each output is an fp32 sum of n products of exact inputs (bf16 values are exact
in fp32), so it carries at most gamma_n * sum|terms| of rounding error (Higham, Accuracy and
Stability of Numerical Algorithms, 3.1), gamma_n = n*u / (1 - n*u), u = 2^-24; a bf16 y adds
one rounding of the sum, at most 2^-8 of its magnitude. A token read through the wrong slot,
a dropped or doubled rank or column moves an output by whole terms, far above these bounds.
"""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from octavo.cpu import kernel_build, kernels, lora
from octavo.cpu.platform import CpuPlatform, cpu_flags
from octavo.lora.ops import group_tokens
from octavo.testing.seeds import draw_seed

pytestmark = pytest.mark.skipif(not lora.available(),
                                reason="the CPU kernels' library is not built here")

U = 2.0 ** -24
BF16_U = 2.0 ** -8

# (slot per token, slots, rank, in, size): runs of every slot, lone tokens, tokens of no
# adapter, a slot never used; one token; a rank not a multiple of the kernels' blocks with
# all tokens but one without adapter; more tokens of a slot than one run of the expand; a
# step without any adapter; outputs wider than the expand's chunk of columns (512), the
# last chunk ending in a partial block.
CASES = [
    ([0] * 5 + [-1] * 3 + [2] * 11 + [0] + [-1] + [2] * 16, 4, 16, 50, 70),
    ([1], 2, 8, 576, 576),
    ([-1, -1, 3, -1, -1], 4, 13, 33, 17),
    ([1] * 150 + [0] * 7 + [1] * 160, 2, 16, 64, 130),
    ([-1, -1, -1], 2, 16, 40, 24),
    ([0] * 6 + [-1] + [1] * 5, 2, 16, 40, 1100),
]


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def lora_library(folder: Path, march: list[str]) -> ctypes.CDLL:
    """cpu_lora.c alone, built as kernel_build builds the library but for ``march`` (seconds
    less than the whole library), its two entry points bound to the header's signatures."""
    compiler = kernel_build.compiler()
    assert compiler is not None
    flags = [flag for flag in kernel_build.FLAGS if flag != "-march=native"] + march
    obj, lib = folder / "cpu_lora.o", folder / "cpu_lora.so"
    for command in ([compiler, *flags, "-c", str(kernel_build.HERE / "cpu_lora.c"), "-o",
                     str(obj)],
                    [compiler, *kernel_build.LINK_FLAGS, str(obj), "-o", str(lib),
                     *kernel_build.LIBS]):
        subprocess.run(command, check=True, capture_output=True)
    library = ctypes.CDLL(str(lib))
    for name in ("octavo_lora_shrink", "octavo_lora_expand"):
        signature = kernels.HEADER.functions[name]
        getattr(library, name).argtypes = signature.argtypes
        getattr(library, name).restype = signature.restype
    return library


# The library as this CPU builds it (AVX-512 with AVX512-BF16 here), and the LoRA kernels as
# an AVX-512 CPU without AVX512-BF16 and an AVX2 CPU (the plain loops) build them.
BUILDS = {"native": None, "no-avx512bf16": ["-march=native", "-mno-avx512bf16"],
          "x86-64-v3": ["-march=x86-64-v3"]}


@pytest.fixture(scope="module")
def built() -> dict[str, ctypes.CDLL]:
    """The builds of BUILDS made so far in this module (each made once)."""
    return {}


@pytest.fixture(params=list(BUILDS))
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
          tmp_path_factory: pytest.TempPathFactory, built: dict[str, ctypes.CDLL]) -> str:
    name = str(request.param)
    march = BUILDS[name]
    if march is not None:
        if platform.machine() != "x86_64":
            pytest.skip("builds for x86-64 CPUs")
        if name == "no-avx512bf16" and "avx512_bf16" not in cpu_flags():
            pytest.skip("the CPU has no AVX512-BF16 to leave out")
        if name not in built:
            built[name] = lora_library(tmp_path_factory.mktemp(name), march)
        library = built[name]
        monkeypatch.setattr(kernels, "library", lambda: library)
    return name


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
    assert CpuPlatform.lora_delta() is lora.bind_delta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_delta_is_the_slice_by_slice_pair(dtype: torch.dtype) -> None:
    """One ``octavo_lora_delta`` call over a packed layer's three slices (a qkv_proj's, GQA
    sizes) gives y bit for bit as the shrink/expand pair called slice by slice: it runs the
    same kernels; stacks or activations it cannot take are left to that pair."""
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    slots_of, num_slots, rank, inp = CASES[0][:4]
    token_lora = torch.tensor(slots_of, dtype=torch.int32)
    groups = group_tokens(token_lora, num_slots)
    slices = [(0, 48), (48, 16), (64, 16)]
    a = torch.randn(len(slices), num_slots, rank, inp, generator=gen).to(dtype)
    b = torch.randn(num_slots, 80, rank, generator=gen).to(dtype)
    x = torch.randn(len(slots_of), inp, generator=gen).to(dtype)
    y = torch.randn(len(slots_of), 80, generator=gen).to(dtype)
    expected = y.clone()
    buf = torch.empty(len(slots_of), rank)
    for index, (offset, size) in enumerate(slices):
        lora.lora_shrink(x, a[index], token_lora, buf, 1.0, groups)
        lora.lora_expand(expected, buf, b[:, offset:offset + size], token_lora, offset, size,
                         groups)
    delta = lora.bind_delta(a, b, slices)
    assert delta is not None and delta(x, y, groups)
    assert torch.equal(y, expected), f"seed {seed}: the one call differs from the pair"
    other = torch.float32 if dtype is torch.bfloat16 else torch.bfloat16
    assert not delta(x.to(other), y, groups), "took x of another dtype than the stacks"
    assert lora.bind_delta(a.to(torch.float16), b.to(torch.float16), slices) is None
    assert lora.bind_delta(a, b.transpose(1, 2).contiguous().transpose(1, 2), slices) is None
