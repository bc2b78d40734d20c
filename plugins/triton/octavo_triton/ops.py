"""The GEMM launchers of octavo-triton that the LoRA and quantized linear methods wire in on
a GPU: multi-LoRA shrink/expand (issue 50) and the W4A16, fp8 and int8 GEMMs (issue 52).

Each is checked under Triton's interpreter against a dense torch reference and compiled
ahead of time for sm_90 and gfx942 (tests/triton); docs/triton-kernels.md says what has and
has not been run on a GPU."""

from __future__ import annotations

from octavo_triton.kernels.lora import TokenGroups, group_tokens_by_lora, lora_expand, lora_shrink
from octavo_triton.kernels.quant_gemm import awq_gemm, gptq_gemm
from octavo_triton.kernels.scaled_mm import e4m3fn_to_fnuz, quantize_per_token, scaled_mm

__all__ = ["TokenGroups", "awq_gemm", "e4m3fn_to_fnuz", "gptq_gemm", "group_tokens_by_lora",
           "lora_expand", "lora_shrink", "quantize_per_token", "scaled_mm"]
