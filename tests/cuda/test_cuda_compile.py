"""Every Triton kernel compiles, with no GPU, to a cubin for sm_80 (A100) and sm_90 (H100)
with the CUDA platform's tuning."""

from __future__ import annotations

from pathlib import Path

from ..triton.helpers import assert_every_kernel_built, compile_ahead_of_time


def test_every_kernel_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    built = compile_ahead_of_time("octavo_cuda.platform:CudaPlatform", ["sm_80", "sm_90"],
                                  tmp_path)
    assert_every_kernel_built(built, "sm_80")
    assert_every_kernel_built(built, "sm_90")
