"""Every Triton kernel compiles, with no GPU, to an hsaco for gfx90a (MI200) and gfx942
(MI300) with the ROCm platform's tuning (64-lane wavefronts, its compiler options)."""

from __future__ import annotations

from pathlib import Path

from ..triton.helpers import assert_every_kernel_built, compile_ahead_of_time


def test_every_kernel_compiles_for_gfx90a_and_gfx942(tmp_path: Path) -> None:
    built = compile_ahead_of_time("octavo_rocm.platform:RocmPlatform", ["gfx90a", "gfx942"],
                                  tmp_path)
    assert_every_kernel_built(built, "gfx90a")
    assert_every_kernel_built(built, "gfx942")
