"""Compiling every kernel ahead of time for a GPU target - no GPU needed.

``triton.compile`` with a ``GPUTarget`` runs the whole compiler down to a cubin (NVIDIA) or
an hsaco (AMD) on any machine. Each kernel is built in the variants the launchers use (the
dtypes, a prompt tile and a decode tile, split-KV, an fp8 cache), with the launch options
of a platform's ``KernelTuning``.

Run as ``python -m tests.triton.aot [--gemm] PLATFORM TARGET...`` (``PLATFORM`` is
``module:Class`` of a GPU platform, ``TARGET`` one of :data:`TARGETS`) in a process *without*
``TRITON_INTERPRET``; it prints one ``ok``/``FAILED`` line per build and exits 1 if any
failed. The tests of the CUDA and ROCm plugins run it in a subprocess for the layer and
attention kernels; ``--gemm`` builds the GEMM kernels instead (LoRA, W4A16, scaled fp8 and
int8), which tests/triton/test_gemm_aot.py compiles for sm_90 and gfx942 only (sm_80 and
gfx90a have no fp8 dot).
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from octavo_triton.kernels.activation import silu_and_mul_kernel
from octavo_triton.kernels.attention import combine_segments_kernel, paged_attention_kernel
from octavo_triton.kernels.kv_cache import reshape_and_cache_kernel
from octavo_triton.kernels.lora import lora_expand_kernel, lora_shrink_kernel
from octavo_triton.kernels.quant_gemm import w4a16_gemm_kernel
from octavo_triton.kernels.rms_norm import rms_norm_kernel
from octavo_triton.kernels.rotary import rotary_kernel
from octavo_triton.kernels.scaled_mm import quantize_per_token_kernel, scaled_mm_kernel
from octavo_triton.tuning import KernelTuning

TARGETS = {
    "sm_80": GPUTarget("cuda", 80, 32),
    "sm_90": GPUTarget("cuda", 90, 32),
    "gfx90a": GPUTarget("hip", "gfx90a", 64),
    "gfx942": GPUTarget("hip", "gfx942", 64),
}
# The fp8 KV-cache format each target supports natively (sm_80 has no e4m3; MI300's is
# the "fnuz" e4m3; MI200 has no fp8 hardware and Triton emulates e4m3).
FP8 = {"sm_80": "fp8e5", "sm_90": "fp8e4nv", "gfx90a": "fp8e4nv", "gfx942": "fp8e4b8"}
FLOAT_ARGS = {"sm_scale", "k_scale", "v_scale", "eps", "scale", "qmax"}
INT_POINTERS = {"block_tables_ptr": "i32", "seq_lens_ptr": "i32", "query_start_loc_ptr": "i32",
                "slot_mapping_ptr": "i64", "positions_ptr": "i64", "sorted_ptr": "i32",
                "counts_ptr": "i32", "starts_ptr": "i32", "qweight_ptr": "i32",
                "qzeros_ptr": "i32", "g_idx_ptr": "i32"}


@dataclass
class Build:
    """One compiled variant: pointer element types by argument (``"*"``: the default) and
    the constexpr values."""

    name: str
    kernel: Any  # a triton JITFunction
    pointers: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]

    def signature(self) -> dict[str, str]:
        signature = {}
        for name in self.kernel.arg_names:
            if name in self.constexprs:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                element = self.pointers.get(name, INT_POINTERS.get(name, self.pointers["*"]))
                signature[name] = "*" + element
            else:
                signature[name] = "fp32" if name in FLOAT_ARGS else "i32"
        return signature


def attention_build(name: str, tuning: KernelTuning, dtype: str, *, cache: str | None = None,
                    group: int, head_dim: int, block_size: int, decode: bool,
                    sliding_window: int = 0, segments: int = 1) -> Build:
    block_m = tuning.attention_block_m(decode, group, head_dim)
    pointers = {"*": dtype, "k_cache_ptr": cache or dtype, "v_cache_ptr": cache or dtype,
                "seg_max_ptr": "fp32", "seg_sum_ptr": "fp32"}
    if segments > 1:
        pointers["out_ptr"] = "fp32"
    constexprs = dict(NUM_HEADS=8 * group, GROUP=group, HEAD_DIM=head_dim, DIM_PAD=head_dim,
                      BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_m // group,
                      SLIDING_WINDOW=sliding_window, SCALED=cache is not None,
                      NUM_SEGMENTS=segments)
    return Build(name, paged_attention_kernel, pointers, constexprs, tuning.attention_launch())


def builds_for(target: str, tuning: KernelTuning) -> list[Build]:
    fp8 = FP8[target]
    elementwise = {"num_warps": tuning.elementwise_warps}
    cache = dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_SIZE=16, HEADS_PAD=8, DIM_PAD=128,
                 TOKENS=tuning.rows_per_program(8 * 128))
    return [
        attention_build("attention bf16 prompt tile, GQA 4, d128, block 16", tuning, "bf16",
                        group=4, head_dim=128, block_size=16, decode=False),
        attention_build("attention fp16 decode tile, GQA 8, d64, block 32, window", tuning,
                        "fp16", group=8, head_dim=64, block_size=32, decode=True,
                        sliding_window=4096),
        attention_build("attention fp32 prompt tile, MHA, d256, block 16", tuning, "fp32",
                        group=1, head_dim=256, block_size=16, decode=False),
        attention_build("attention bf16 split-KV decode, GQA 8, d128", tuning, "bf16",
                        group=8, head_dim=128, block_size=16, decode=True,
                        segments=tuning.split_kv_segments),
        attention_build(f"attention bf16, {fp8} cache, GQA 4, d128", tuning, "bf16",
                        cache=fp8, group=4, head_dim=128, block_size=16, decode=False),
        Build("combine split-KV segments bf16, d128", combine_segments_kernel,
              {"*": "fp32", "out_ptr": "bf16"},
              dict(NUM_HEADS=32, HEAD_DIM=128, DIM_PAD=128,
                   NUM_SEGMENTS=tuning.split_kv_segments), elementwise),
        Build("reshape_and_cache bf16", reshape_and_cache_kernel, {"*": "bf16"},
              {**cache, "SCALED": False}, elementwise),
        Build(f"reshape_and_cache bf16 -> {fp8}", reshape_and_cache_kernel,
              {"*": "bf16", "key_cache_ptr": fp8, "value_cache_ptr": fp8},
              {**cache, "SCALED": True}, elementwise),
        Build("rms_norm + residual bf16, hidden 4096", rms_norm_kernel, {"*": "bf16"},
              dict(HIDDEN=4096, BLOCK=4096, ROWS=tuning.rows_per_program(4096),
                   HAS_RESIDUAL=True), elementwise),
        Build("rms_norm bf16, hidden 576, several rows a program", rms_norm_kernel,
              {"*": "bf16"}, dict(HIDDEN=576, BLOCK=1024, ROWS=tuning.rows_per_program(1024),
                                  HAS_RESIDUAL=False), elementwise),
        Build("rotary bf16, 32/8 heads, d128", rotary_kernel,
              {"*": "bf16", "inv_freq_ptr": "fp32"},
              dict(NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=64,
                   HALF_PAD=64, TOKENS=tuning.rows_per_program(32 * 128)), elementwise),
        Build("silu_and_mul bf16", silu_and_mul_kernel, {"*": "bf16"},
              dict(D=14336, BLOCK=1024, ROWS=tuning.rows_per_program(1024)), elementwise),
    ]


def gemm_builds_for(target: str) -> list[Build]:
    """The GEMM kernels in the variants their launchers use, with the launchers' (default)
    launch options."""
    fp8 = FP8[target]
    lora = dict(BLOCK_M=16, BLOCK_N=16)
    w4a16 = dict(BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=32)
    scales = {"a_scale_ptr": "fp32", "b_scale_ptr": "fp32"}
    return [
        Build("lora_shrink bf16, rank 16", lora_shrink_kernel, {"*": "bf16", "out_ptr": "fp32"},
              {**lora, "BLOCK_K": 32}, {}),
        Build("lora_expand bf16, rank 16", lora_expand_kernel, {"*": "bf16", "buf_ptr": "fp32"},
              {**lora, "BLOCK_N": 64, "RANK_PAD": 16}, {}),
        Build("w4a16 AWQ bf16, decode tile", w4a16_gemm_kernel,
              {"*": "bf16", "out_ptr": "fp32"},
              {**w4a16, "AWQ": True, "ZERO_OFFSET": 0, "HAS_G_IDX": False}, {}),
        Build("w4a16 GPTQ fp16, act-order", w4a16_gemm_kernel, {"*": "fp16"},
              {**w4a16, "AWQ": False, "ZERO_OFFSET": 1, "HAS_G_IDX": True}, {}),
        Build(f"scaled_mm {fp8} -> bf16, per-token x per-channel", scaled_mm_kernel,
              {"*": fp8, **scales, "out_ptr": "bf16"},
              dict(PER_TOKEN=True, PER_CHANNEL=True, INT8=False, BLOCK_M=64, BLOCK_N=64,
                   BLOCK_K=64), {}),
        Build("scaled_mm int8 -> bf16, per-token x per-channel", scaled_mm_kernel,
              {"*": "i8", **scales, "out_ptr": "bf16"},
              dict(PER_TOKEN=True, PER_CHANNEL=True, INT8=True, BLOCK_M=16, BLOCK_N=64,
                   BLOCK_K=64), {}),
        Build(f"quantize_per_token bf16 -> {fp8}", quantize_per_token_kernel,
              {"*": fp8, "scale_ptr": "fp32", "x_ptr": "bf16"},
              dict(STATIC=False, INT8=False, BLOCK=1024), {}),
    ]


def compile_build(build: Build, target: GPUTarget) -> bytes:
    """The binary (cubin or hsaco) of one build for one target."""
    source = ASTSource(build.kernel, build.signature(), build.constexprs)
    compiled = triton.compile(source, target=target, options=build.options)
    binary = compiled.asm.get("cubin") or compiled.asm.get("hsaco")
    if not binary:
        raise RuntimeError(f"no binary produced (stages: {', '.join(compiled.asm)})")
    return binary


def main(argv: list[str]) -> int:
    gemm = argv[0] == "--gemm"
    argv = argv[1:] if gemm else argv
    module_name, class_name = argv[0].split(":")
    platform = getattr(importlib.import_module(module_name), class_name)
    failed = 0
    for target in argv[1:]:
        builds = gemm_builds_for(target) if gemm else builds_for(target, platform.kernel_tuning)
        for build in builds:
            start = time.perf_counter()
            try:
                binary = compile_build(build, TARGETS[target])
            except Exception as exc:  # report every failure, then exit non-zero
                failed += 1
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
                print(f"FAILED {target} {build.name}: {type(exc).__name__}: {reason}")
                continue
            print(f"ok {target} {build.name}: {len(binary)} bytes in "
                  f"{time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
