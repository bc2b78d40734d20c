"""Matrix products and embedding lookups on GGUF quantized weights kept as the file's blocks
(cpu_quant.c): their typed Python wrappers.

Why: a single-stream decode step is memory-bound, so it runs as fast as the weight bytes it
streams. A Q4_1 weight is about 5 bits per value against bf16's 16; dequantizing it at load
throws that away. These kernels read the blocks as the GGUF file stores them (llama.cpp's
layouts; each row of a weight is its own run of blocks) and decode them as they multiply.

How: a decode step (at most ``DECODE_ROWS`` activation rows) runs a C kernel, output rows
shared among torch's OpenMP threads. For Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 on a CPU with
AVX512-VNNI it quantizes the activations to int8 per 32 values, as llama.cpp does, and takes
integer dot products of the blocks as they are (``Q8_ACTIVATIONS``; the result then carries
the activations' rounding, at most max|x| / 254 per value of a block); otherwise it decodes
each weight block into fp32 registers (AVX-512) or an L1 buffer (portable C) and sums fp32
products. More rows (a W1 step of many requests, a prefill), where the arithmetic, not the
weight bytes, is what costs: up to ``GEMM_Q8_ROWS`` rows of Q4_0, Q4_1, Q8_0, Q4_K and Q6_K
with AVX512-VNNI (and ``Q8_ACTIVATIONS``), the many-row kernel of cpu_quant_gemm.c
(activations quantized the same way, each block of 16 weight rows gathered once into
registers and multiplied with every row by vpdpbusd); otherwise the weight is dequantized a
panel of rows at a time and the panel multiplied with torch's matmul in the activations'
dtype (bf16 panels on the CPU's bf16 units, as a dense bf16 model runs). The fp32 kernels
accumulate in fp32 on fp32 activations (bf16 ones are widened first), so their result is the
dense product of the dequantized weight up to fp32 rounding. The dequantized values equal
gguf's and llama.cpp's bit for bit.
"""

from __future__ import annotations

import ctypes

import torch
from gguf import GGMLQuantizationType as GgmlType

from octavo.cpu import kernels

# Activation rows up to which quant_matmul runs the decode kernel; above, a panel at a time
# is dequantized and multiplied densely.
DECODE_ROWS = kernels.HEADER.constants["QUANT_DECODE_ROWS"]
# Whether decode steps of the types with a VNNI kernel (quant_q8_available) quantize the
# activations to int8 per 32 values and take integer dot products, as llama.cpp does, rather
# than widen the weights to fp32 (benchmarks/quant_gemm.py measures both).
Q8_ACTIVATIONS = True
# Activation rows up to which a product of more than DECODE_ROWS rows runs the many-row
# VNNI kernel (quant_gemm_q8_available types, with Q8_ACTIVATIONS); above, bf16 panels: as
# fast at 256 rows here (but 1.4-2x slower at 16 and 64 rows), and a long prefill keeps bf16
# activations (with the kernel on its 87-row prefill, test_gguf_quantized's teacher-forced
# agreement with the dense model fell from 87/87 to 82/87 positions).
GEMM_Q8_ROWS = 64
PANEL_ELEMS = 1 << 22  # weight values dequantized per panel of a prefill (16 MB fp32, 8 MB bf16)

_TYPES = frozenset(int(t) for t in (
    GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q8_0,
    GgmlType.Q2_K, GgmlType.Q3_K, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K,
    GgmlType.IQ4_NL))


def quant_types() -> frozenset[int]:
    """The ``GGMLQuantizationType`` values the kernels serve."""
    return _TYPES


def quant_kernels_available() -> bool:
    """Whether the compiled library is loaded (it has the kernels of every type in
    :func:`quant_types`, with a portable path where the CPU lacks AVX-512)."""
    return kernels.library() is not None


def quant_q8_available(ggml_type: int) -> bool:
    """Whether decode steps of ``ggml_type`` can run the Q8-activation VNNI kernel here."""
    lib = kernels.library()
    return lib is not None and bool(lib.octavo_quant_q8_available(ggml_type))


def quant_gemm_q8_available(ggml_type: int) -> bool:
    """Whether products of more than ``DECODE_ROWS`` rows of ``ggml_type`` can run the
    many-row VNNI kernel on Q8 activations here (cpu_quant_gemm.c)."""
    lib = kernels.library()
    return lib is not None and bool(lib.octavo_quant_gemm_q8_available(ggml_type))


def quant_row_bytes(ggml_type: int, in_features: int) -> int:
    """The bytes of one weight row of ``in_features`` values; ValueError naming the problem
    where the type is not served or ``in_features`` is not a whole number of its blocks."""
    if ggml_type not in _TYPES:
        name = GgmlType(ggml_type).name if ggml_type in GgmlType._value2member_map_ else ggml_type
        raise ValueError(f"GGUF type {name} has no quantized CPU kernel (served: "
                         f"{', '.join(sorted(GgmlType(t).name for t in _TYPES))})")
    row_bytes = int(_library().octavo_quant_row_bytes(ggml_type, in_features))
    if row_bytes == 0:
        raise ValueError(f"{GgmlType(ggml_type).name} rows of {in_features} values are not a "
                         f"whole number of its blocks")
    return row_bytes


def _library() -> ctypes.CDLL:
    lib = kernels.library()
    if lib is None:
        raise RuntimeError("the CPU kernels' library is not loaded: check "
                           "quant_kernels_available() first")
    return lib


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int,
                 out_features: int, in_features: int) -> torch.Tensor:
    """``x @ W.T`` for ``x`` [..., in] (fp32 or bf16) and the weight ``W`` [out, in] given
    as its GGUF blocks (uint8 [out, row bytes], each row its blocks in the file's order):
    [..., out] in ``x``'s dtype, summed in fp32 (bf16 prefills: on bf16-rounded weights)."""
    check_blocks(blocks, ggml_type, out_features, in_features)
    return checked_matmul(x, blocks, ggml_type, out_features, in_features,
                          decode_kernel(ggml_type))


def check_blocks(blocks: torch.Tensor, ggml_type: int, rows: int, in_features: int) -> None:
    """ValueError naming the problem where ``blocks`` are not the GGUF blocks of a
    [rows, in_features] weight of ``ggml_type`` that the kernels serve."""
    expected = (rows, quant_row_bytes(ggml_type, in_features))
    if blocks.dtype is not torch.uint8 or not blocks.is_contiguous() or not blocks.is_cpu:
        raise ValueError(f"quantized blocks must be a contiguous uint8 CPU tensor, got "
                         f"{blocks.dtype} on {blocks.device}")
    if tuple(blocks.shape) != expected:
        raise ValueError(f"{GgmlType(ggml_type).name} blocks of a [{rows}, {in_features}] "
                         f"weight have shape {list(expected)}, got {list(blocks.shape)}")


def decode_kernel(ggml_type: int) -> str:
    """The C entry point that a decode step of ``ggml_type`` runs here."""
    return ("octavo_quant_matmul_q8" if Q8_ACTIVATIONS and quant_q8_available(ggml_type)
            else "octavo_quant_matmul")


def checked_matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, out_features: int,
                   in_features: int, kernel: str) -> torch.Tensor:
    """:func:`quant_matmul` on blocks already checked by :func:`check_blocks`, a decode step
    running ``kernel`` (:func:`decode_kernel`). Why apart: a layer checks its blocks and
    picks its kernel once, not in every call of every step (two C calls and the checks
    per layer per step)."""
    if x.shape[-1] != in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {in_features}")
    rows = x.numel() // in_features
    if rows == 0:
        return x.new_empty((*x.shape[:-1], out_features))
    if rows <= DECODE_ROWS:
        y = _kernel_matmul(kernel, x, blocks, ggml_type, out_features, in_features)
    elif Q8_ACTIVATIONS and rows <= GEMM_Q8_ROWS and quant_gemm_q8_available(ggml_type):
        y = _kernel_matmul("octavo_quant_gemm_q8", x, blocks, ggml_type, out_features,
                           in_features)
    else:
        y = _panel_matmul(x.reshape(-1, in_features), blocks, ggml_type, out_features,
                          in_features)
    return y.to(x.dtype).reshape(*x.shape[:-1], out_features)


def _kernel_matmul(kernel: str, x: torch.Tensor, blocks: torch.Tensor, ggml_type: int,
                   out_features: int, in_features: int) -> torch.Tensor:
    """The fp32 product [rows, out] of ``x``'s rows (widened to fp32) by C entry ``kernel``."""
    x32 = x.reshape(-1, in_features).to(torch.float32).contiguous()
    y = torch.empty((x32.shape[0], out_features), dtype=torch.float32)
    status = getattr(_library(), kernel)(
        y.data_ptr(), x32.data_ptr(), x32.shape[0], blocks.data_ptr(), ggml_type, out_features,
        in_features)
    kernels.check_status(kernel, status)
    return y


def _panel_matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int,
                  out_features: int, in_features: int) -> torch.Tensor:
    """The prefill product of rows ``x`` [T, in]: a panel of weight rows dequantized at a
    time into one buffer (a fresh large tensor would be page-faulted in on every call), then
    multiplied in ``x``'s dtype: bf16 by the CPU's bf16 matmul (oneDNN: AMX or AVX512-BF16
    where present, the weights rounded to bf16 as a dense bf16 model's are), fp32 in fp32."""
    dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float32) else torch.float32
    x = x.to(dtype)
    y = torch.empty((x.shape[0], out_features), dtype=dtype)
    panel = max(1, min(out_features, PANEL_ELEMS // in_features))
    buffer = torch.empty((panel, in_features), dtype=dtype)
    for start in range(0, out_features, panel):
        stop = min(start + panel, out_features)
        weight = buffer[: stop - start]
        if dtype is torch.bfloat16:  # straight to bf16: no fp32 pass over the panel
            status = _library().octavo_quant_dequantize_bf16(
                weight.data_ptr(), blocks[start].data_ptr(), stop - start, ggml_type,
                in_features)
            kernels.check_status("octavo_quant_dequantize_bf16", status)
        else:
            _dequantize(weight, blocks[start:stop], None, ggml_type)
        y[:, start:stop] = x @ weight.T
    return y


def _dequantize(out: torch.Tensor, blocks: torch.Tensor, ids: torch.Tensor | None,
                ggml_type: int) -> torch.Tensor:
    """Rows ``ids`` of ``blocks`` (rows 0..len(out) with ids None) into fp32 ``out``."""
    n, in_features = out.shape
    status = _library().octavo_quant_dequantize(
        out.data_ptr(), blocks.data_ptr(), None if ids is None else ids.data_ptr(), n,
        ggml_type, in_features)
    kernels.check_status("octavo_quant_dequantize", status)
    return out


def quant_rows(blocks: torch.Tensor, ids: torch.Tensor, ggml_type: int,
               in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The dequantized rows ``ids`` (int64, any shape) of the weight given as its GGUF
    blocks (uint8 [rows, row bytes]): ``ids.shape + (in_features,)`` in ``dtype`` (the
    embedding lookup). IndexError naming the first id out of range."""
    check_blocks(blocks, ggml_type, blocks.shape[0], in_features)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= blocks.shape[0]):
        bad = flat[(flat < 0) | (flat >= blocks.shape[0])][0]
        raise IndexError(f"row id {int(bad)} is out of range for {blocks.shape[0]} rows")
    rows = _dequantize(torch.empty((flat.numel(), in_features)), blocks, flat, ggml_type)
    return rows.to(dtype).reshape(*ids.shape, in_features)
