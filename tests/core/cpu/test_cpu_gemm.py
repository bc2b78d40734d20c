"""The CPU GEMM paths of bf16 layers against ``F.linear`` on the same bf16 tensors, and their
wiring into a model built in bf16 on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.gemm import AMX_ONEDNN_ROWS, LARGE_ROWS, CpuGemm, cpu_gemm_supported
from octavo.cpu.platform import CpuPlatform
from octavo.models.build import build_model
from octavo.models.layers.linear import LinearBase
from octavo.models.loader import load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not cpu_gemm_supported(torch.bfloat16, torch.device("cpu")),
                                 reason="torch built without oneDNN")]


# How CpuGemm is built on each kind of CPU, and which kernels it may use.
PATHS = {
    "pair": dict(native_bf16=True, amx=False, kernels=True),
    "pair then onednn (amx)": dict(native_bf16=True, amx=True, kernels=True),
    "onednn (native, no kernels)": dict(native_bf16=True, amx=False, kernels=False),
    "panel then fp32 (not native)": dict(native_bf16=False, amx=False, kernels=True),
    "onednn then fp32 (not native, no kernels)": dict(native_bf16=False, amx=False,
                                                      kernels=False),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 3, AMX_ONEDNN_ROWS, LARGE_ROWS, 77, 300])
@pytest.mark.parametrize("shape", [(96, 80), (37, 82), (40, 81)],
                         ids=["whole panels", "a partial panel", "odd inputs"])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(path: str, rows: int, shape: tuple[int, int], bias: bool,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path against an fp32 product of the same bf16 values."""
    setup = PATHS[path]
    if not setup["kernels"]:
        monkeypatch.setattr(cpu_kernels, "gemm_available", lambda: False)
        monkeypatch.setattr(cpu_kernels, "pair_gemm_available", lambda: False)
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=gen).bfloat16()
    b = torch.randn(shape[0], generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, shape[1], generator=gen).bfloat16()
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    out = CpuGemm(weight, b, setup["native_bf16"], setup["amx"])(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, shape[0])
    # Both are bf16 products summed in fp32 and rounded once to bf16: within bf16 rounding.
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-2,
                               msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.skipif(not cpu_kernels.pair_gemm_available(), reason="needs AVX512-BF16")
def test_a_released_weight_is_refused_loudly() -> None:
    """Once the plain weight is given up, an input only it could serve is an error naming
    why, not a product with a meta tensor."""
    gemm = CpuGemm(torch.randn(32, 64).bfloat16(), None, native_bf16=True)
    assert gemm.release_weight().is_meta
    with pytest.raises(RuntimeError, match="plain weight was released"):
        gemm(torch.randn(3, 64))  # fp32


@pytest.mark.skipif(not cpu_kernels.pair_gemm_available(), reason="needs AVX512-BF16")
def test_the_pair_gemm_keeps_one_copy_and_serves_every_row_count() -> None:
    """Without AMX the pair GEMM is the only prepacked copy, at any row count (and so any
    strided input); its rows are the sums a bf16 GEMM rounds."""
    weight = torch.randn(50, 64).bfloat16()
    gemm = CpuGemm(weight, None, native_bf16=True)
    assert gemm.pairs is not None
    assert gemm.packed is None and gemm.panels is None and gemm.packed32 is None
    x = torch.randn(2, 700, 128).bfloat16()[:, :, ::2]  # rows 128 apart, strided elements
    torch.testing.assert_close(gemm(x).float(), F.linear(x.float(), weight.float()),
                               rtol=2**-7, atol=1e-2)


@pytest.mark.skipif(not cpu_kernels.pair_gemm_available(), reason="needs AVX512-BF16")
@pytest.mark.parametrize("rows", [1, 5, 64, 301])
@pytest.mark.parametrize("d", [16, 48, 96], ids=["one panel", "odd panels", "even panels"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_silu_rounds_as_the_two_steps(rows: int, d: int, bias: bool,
                                           threads: int) -> None:
    """The gate/up GEMM with SiLU-and-mul in its epilogue gives, bit for bit, the pair
    GEMM's [gate | up] followed by the SiLU kernel, on one thread and on two (each owning
    a range of gate panels, odd or even in number), and stays the activation of the fp32
    product."""
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(2 * d, 128, generator=gen).bfloat16()
    b = torch.randn(2 * d, generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, 128, generator=gen).bfloat16()
    gemm = CpuGemm(weight, b, native_bf16=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused = gemm.silu_and_mul(x)
        two_steps = cpu_kernels.silu_and_mul(gemm(x))
    finally:
        torch.set_num_threads(before)
    assert fused is not None and fused.shape == (rows, d)
    assert torch.equal(fused, two_steps), f"seed={seed}"
    projected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    torch.testing.assert_close(fused.float(), F.silu(projected[:, :d]) * projected[:, d:],
                               rtol=2**-6, atol=5e-2, msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.skipif(not cpu_kernels.pair_gemm_available(), reason="needs AVX512-BF16")
def test_fused_silu_declines_what_it_cannot_take() -> None:
    """Halves that are not whole panels, and inputs the pair GEMM does not serve (fp32),
    are left to the two steps."""
    assert CpuGemm(torch.randn(2 * 24, 64).bfloat16(), None, True).silu_and_mul(
        torch.randn(3, 64).bfloat16()) is None
    assert CpuGemm(torch.randn(2 * 32, 64).bfloat16(), None, True).silu_and_mul(
        torch.randn(3, 64)) is None


def test_bf16_model_on_cpu_uses_them(tmp_path: Path) -> None:
    save_tiny_model("qwen3", tmp_path, seed=0)  # tied embeddings: the head too
    files = load_model_files(str(tmp_path))
    model = build_model(files, torch.bfloat16, TorchAttentionBackend)
    CpuPlatform.prepare_model(model, torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(m.cpu_gemm is not None for m in linears)
    assert model.lm_head.cpu_gemm is not None
    if cpu_kernels.pair_gemm_available() and not CpuPlatform.has_amx():
        # One copy of each linear weight stays: the pair GEMM's; the tied head's is the
        # embedding table, which the model still reads.
        assert all(m.weight.is_meta for m in linears)
        assert not model.lm_head.weight.is_meta
    fp32 = build_model(files, torch.float32, TorchAttentionBackend)
    CpuPlatform.prepare_model(fp32, torch.float32)
    assert all(m.cpu_gemm is None for m in fp32.modules() if isinstance(m, LinearBase))
