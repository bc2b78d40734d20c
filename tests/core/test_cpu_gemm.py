"""The CPU GEMM paths of bf16 layers against ``F.linear`` on the same bf16 tensors, and their
wiring into a model built in bf16 on the CPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.gemm import LARGE_ROWS, PANEL_MAX_ROWS, CpuGemm, cpu_gemm_supported
from octavo.cpu.platform import CpuPlatform
from octavo.models.build import build_model
from octavo.models.layers.linear import LinearBase
from octavo.models.loader import load_model_files

from .tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not cpu_gemm_supported(torch.bfloat16, torch.device("cpu")),
                                 reason="torch built without oneDNN")]


@pytest.mark.parametrize("panels", [True, False], ids=["panel-gemm", "onednn-only"])
@pytest.mark.parametrize("native_bf16", [False, True])
@pytest.mark.parametrize("rows", [1, 3, PANEL_MAX_ROWS, LARGE_ROWS, 77, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(panels: bool, native_bf16: bool, rows: int, bias: bool,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path: the panel GEMM where the kernels have it, else oneDNN's bf16 and fp32."""
    if not panels:
        monkeypatch.setattr(cpu_kernels, "gemm_available", lambda: False)
    seed = random.SystemRandom().randrange(2**32)
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(96, 80, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, 80, generator=gen).bfloat16()
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    out = CpuGemm(weight, b, native_bf16)(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 96)
    # Both are bf16 products summed in fp32 and rounded once to bf16: within bf16 rounding.
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-2,
                               msg=lambda m: f"seed={seed}: {m}")


def test_bf16_model_on_cpu_uses_them(tmp_path: Path) -> None:
    save_tiny_model("qwen3", tmp_path, seed=0)  # tied embeddings: the head too
    files = load_model_files(str(tmp_path))
    model = build_model(files, torch.bfloat16, TorchAttentionBackend)
    CpuPlatform.prepare_model(model, torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(m.cpu_gemm is not None for m in linears)
    assert model.lm_head.cpu_gemm is not None
    fp32 = build_model(files, torch.float32, TorchAttentionBackend)
    CpuPlatform.prepare_model(fp32, torch.float32)
    assert all(m.cpu_gemm is None for m in fp32.modules() if isinstance(m, LinearBase))
