"""Quantized checkpoints written from each format's published spec, for the tests of
``octavo.models.layers.checkpoint_*`` and benchmarks/quant_formats.py.

The packing here follows the tools' writers loop for loop (AutoAWQ ``WQLinear_GEMM
.from_linear``, AutoGPTQ ``QuantLinear.pack``, compressed-tensors ``pack_to_int32``), not
octavo's unpacking, so a wrong field order or offset on either side shows; the
compressed-tensors fixtures are packed by compressed-tensors itself (``pack_to_int32``, what
llm-compressor saves with). Each quantizer returns the checkpoint tensors of one linear
weight, the dense weight they stand for, ``(q - z) * s`` from the integers and the stored
scales (the reference), and that weight as GGUF blocks hold it (``q * fp16(s) +
fp16(-z * s)``, octavo's CPU form of 4-bit and symmetric 8-bit integers: int_weights.py),
which octavo must match to fp32 rounding.

``quantize_folder`` turns a dense HF Llama folder into one quantized checkpoint and the
folders of its dequantized weights (both fp32 reference models).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: field i of a word holds column AWQ_ORDER[i]
# The decoder's linear layers, and Mixtral's experts (w1, w3: gate, up; w2: down); a mixture
# of experts' router (``gate``) stays dense, as the tools leave it.
LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "down_proj", "w1", "w2", "w3")

Tensors = dict[str, torch.Tensor]
Quantized = tuple[Tensors, torch.Tensor, torch.Tensor]  # tensors, exact, as blocks hold it
Quantizer = Callable[[torch.Tensor], Quantized]


def group_quantize(w: torch.Tensor, bits: int, group: int, sym: bool,
                   g_idx: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest ``w [out, in]`` per group of ``group`` columns (by ``g_idx`` where
    given): unsigned ``q``, fp16-representable ``scales``/``zeros`` ``[out, groups]``, and
    the group of each column."""
    out, cols = w.shape
    group = cols if group == -1 else group
    groups = torch.arange(cols) // group if g_idx is None else g_idx.long()
    n = int(groups.max()) + 1
    top = (1 << bits) - 1
    lo = torch.stack([w[:, groups == g].amin(1) for g in range(n)], 1).clamp(max=0)
    hi = torch.stack([w[:, groups == g].amax(1) for g in range(n)], 1).clamp(min=0)
    if sym:
        scales = (torch.maximum(-lo, hi) * 2 / top).clamp(min=1e-5).half().float()
        zeros = torch.full_like(scales, float(1 << (bits - 1)))
    else:
        scales = ((hi - lo) / top).clamp(min=1e-5).half().float()
        zeros = (-lo / scales).round().clamp(0, top)
    q = (w / scales[:, groups] + zeros[:, groups]).round().clamp(0, top)
    return q.to(torch.int64), scales, zeros, groups


def dequantized(q, scales, zeros, groups, blocks: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact weight, and the weight as blocks hold it (``blocks`` False: the same)."""
    exact = (q.float() - zeros[:, groups]) * scales[:, groups]
    if not blocks:
        return exact, exact
    half = scales.half().float()
    return exact, q.float() * half[:, groups] + (-zeros * scales).half().float()[:, groups]


def to_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 as int32 (two's complement)."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ: ``values [rows, cols]`` (4-bit) packed 8 columns a word, AWQ's order."""
    words = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for col in range(words.shape[1]):
        for i in range(8):
            words[:, col] |= values[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    return to_int32(words)


def pack_sequential(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """AutoGPTQ / compressed-tensors: ``32 // bits`` values a word along ``dim``, the first
    in the lowest bits."""
    per = 32 // bits
    moved = values.movedim(dim, -1)
    fields = moved.reshape(*moved.shape[:-1], -1, per)
    shifts = torch.arange(0, 32, bits)
    words = (fields << shifts).sum(-1)
    return to_int32(words).movedim(-1, dim).contiguous()


def awq(group: int) -> Quantizer:
    def quantize(w: torch.Tensor) -> Quantized:
        q, scales, zeros, groups = group_quantize(w, 4, group, sym=False)
        return ({"qweight": pack_awq(q.T.contiguous()), "qzeros": pack_awq(zeros.long().T),
                 "scales": scales.T.half().contiguous()},
                *dequantized(q, scales, zeros, groups))
    return quantize


def gptq(bits: int, group: int, sym: bool, act_order: bool, seed: int,
         v2: bool = False) -> Quantizer:
    def quantize(w: torch.Tensor) -> Quantized:
        g_idx = None
        if act_order:  # GPTQ's g_idx: group of each column's position in a permutation
            perm = torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(seed))
            size = w.shape[1] if group == -1 else group
            g_idx = torch.empty(w.shape[1], dtype=torch.int64)
            g_idx[perm] = torch.arange(w.shape[1]) // size
        q, scales, zeros, groups = group_quantize(w, bits, group, sym, g_idx)
        stored_zeros = zeros.long() - (0 if v2 else 1)
        return ({"qweight": pack_sequential(q.T, bits, 0),
                 "qzeros": pack_sequential(stored_zeros.T, bits, 1),
                 "scales": scales.T.half().contiguous(), "g_idx": groups.to(torch.int32)},
                *dequantized(q, scales, zeros, groups, blocks=bits == 4 or sym))
    return quantize


def ct_packed(bits: int, group: int, sym: bool) -> Quantizer:
    def quantize(w: torch.Tensor) -> Quantized:
        q, scales, zeros, groups = group_quantize(w, bits, group, sym)
        # compressed-tensors' own packer (a dev dependency): signed int8 in
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

        offset = 1 << (bits - 1)
        tensors = {"weight_packed": pack_to_int32((q - offset).to(torch.int8), bits),
                   "weight_scale": scales.bfloat16(),
                   "weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}
        if not sym:
            tensors["weight_zero_point"] = (zeros - (1 << (bits - 1))).to(torch.int8)
        return tensors, *dequantized(q, scales.bfloat16().float(), zeros, groups,
                                     blocks=bits == 4 or sym)
    return quantize


def ct_int8(w: torch.Tensor) -> Quantized:
    """W8A8: int8 per-channel symmetric weights, fp32 scales."""
    scales = (w.abs().amax(1, keepdim=True) / 127).clamp(min=1e-8)
    q = (w / scales).round().clamp(-127, 127).to(torch.int8)
    return ({"weight": q, "weight_scale": scales}, q.float() * scales,
            q.float() * scales.half().float())


def fp8(per_channel: bool, static: bool) -> Quantizer:
    def quantize(w: torch.Tensor) -> Quantized:
        amax = w.abs().amax(1, keepdim=True) if per_channel else w.abs().amax()
        scales = (amax / 448).clamp(min=1e-8).float()
        q = (w / scales).to(torch.float8_e4m3fn)
        tensors = {"weight": q, "weight_scale": scales if per_channel else scales.reshape(())}
        if static:
            tensors["input_scale"] = torch.tensor(0.02)
        return tensors, q.float() * scales, q.float() * scales
    return quantize


def quantize_folder(dense: Path, folder: Path, exact: Path, as_blocks: Path,
                    quantizer: Quantizer, quantization_config: dict) -> None:
    """``dense``'s model with every decoder linear layer quantized into ``folder`` (config
    gets ``quantization_config``), and the same model dequantized (fp32) into ``exact`` and
    as GGUF blocks hold it into ``as_blocks``."""
    for target in (folder, exact, as_blocks):
        shutil.copytree(dense, target)
        (target / "model.safetensors").unlink()
    quantized: Tensors = {}
    references: tuple[Tensors, Tensors] = ({}, {})
    for name, tensor in load_file(dense / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR_SUFFIXES:
            tensors, *dense_forms = quantizer(tensor.float())
            prefix = name.removesuffix("weight")
            quantized.update({prefix + k: v.contiguous() for k, v in tensors.items()})
        else:
            quantized[name] = tensor
            dense_forms = [tensor.float()] * 2
        for reference, weight in zip(references, dense_forms):
            reference[name] = weight.contiguous()
    save_file(quantized, folder / "model.safetensors")
    for reference, target in zip(references, (exact, as_blocks)):
        save_file(reference, target / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
