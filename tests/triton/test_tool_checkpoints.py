"""The W4A16 GEMM kernels (under Triton's interpreter on the CPU) on layers that the real
tools wrote (issue 52): AutoAWQ's AWQ GEMM layout and GPTQModel's GPTQ act-order 4-bit and
8-bit (tests/core/models/tool_checkpoints.py), against ``x @ W.T`` with ``W`` dequantized by
the tool's own code.

The bound: GPTQModel dequantizes in fp16 (one rounding, ``2^-11`` of each weight), the
kernel in fp32; both sums are fp32 over 256 terms. ``2^-10 |x| @ |W|.T`` covers both, and
a layout error (a field order, a zero-point offset, a group) moves weights by whole
quantization steps, far above it. Skipped where a tool's environment is not installed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.quant_gemm import awq_gemm, gptq_gemm
from tests.core.models.tool_checkpoints import tool_checkpoints

from .helpers import DEVICE

LAYER = "model.layers.0.mlp.down_proj."  # 256 inputs, 128 outputs


@pytest.mark.parametrize(("tool", "scheme"), [("autoawq", "awq"),
                                              ("gptqmodel", "gptq-4bit-act-order"),
                                              ("gptqmodel", "gptq-8bit")])
def test_a_tool_written_layer_multiplies_as_the_tools_dequantized_weight(tool, scheme):
    checkpoint = tool_checkpoints(tool)[scheme]
    tensors = load_file(checkpoint.folder / "model.safetensors")
    config = json.loads((checkpoint.folder / "config.json").read_text())["quantization_config"]
    weight = load_file(checkpoint.exact / "model.safetensors")[LAYER + "weight"]
    seed = draw_seed()
    x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(seed))
    qweight, qzeros = tensors[LAYER + "qweight"], tensors[LAYER + "qzeros"]
    scales = tensors[LAYER + "scales"].float()
    on = {"device": DEVICE}
    if config["quant_method"] == "awq":
        got = awq_gemm(x.to(**on), qweight.to(**on), scales.to(**on), qzeros.to(**on))
    else:
        g_idx = tensors[LAYER + "g_idx"].to(**on) if config["desc_act"] else None
        got = gptq_gemm(x.to(**on), qweight.to(**on), scales.to(**on), qzeros.to(**on), g_idx,
                        config["bits"], config.get("checkpoint_format", "gptq"))
    want = x.double() @ weight.double().T
    bound = 2.0 ** -10 * (x.abs().double() @ weight.abs().double().T) + 1e-6
    error = (got.cpu().double() - want).abs()
    print(f"{tool} {scheme}: kernel off by {error.max():.2e} (bound {bound.min():.2e} at least)")
    assert (error <= bound).all(), f"seed {seed}: {tool} {scheme} off by {error.max():.2e}"
