"""The GEMM kernels (LoRA shrink/expand, W4A16 AWQ/GPTQ, fp8 and int8 scaled GEMMs and the
activation quantizer) compile, with no GPU, to a cubin for sm_90 (H100) and an hsaco for
gfx942 (MI300)."""

from __future__ import annotations

from pathlib import Path

from .helpers import compile_ahead_of_time

FAMILIES = ("lora_shrink", "lora_expand", "w4a16 AWQ", "w4a16 GPTQ", "scaled_mm",
            "quantize_per_token")


def test_gemm_kernels_compile_for_sm90_and_gfx942(tmp_path: Path) -> None:
    # One process for both targets: the GEMM builds take the launchers' default launch
    # options, not a platform's tuning, so the platform named does not matter.
    built = compile_ahead_of_time("octavo_cuda.platform:CudaPlatform", ["sm_90", "gfx942"],
                                  tmp_path, gemm=True)
    for target in ("sm_90", "gfx942"):
        names = [line.split(" ", 2)[2] for line in built if line.startswith(f"ok {target} ")]
        missing = [family for family in FAMILIES if not any(n.startswith(family) for n in names)]
        assert not missing, f"{target}: nothing built for {missing}; built: {names}"
        assert sum(n.startswith("scaled_mm") for n in names) == 2  # fp8 and int8
