"""Checkpoints written by the real tools (issue 52): llm-compressor (W4A16, W8A8 int8, fp8
static and dynamic), GPTQModel (GPTQ 4-bit act-order, 8-bit) and AutoAWQ (AWQ GEMM), each
from the same tiny random Llama calibrated on fixed random tokens (tool_checkpoints.py),
against that checkpoint dequantized to fp32 by the tool's own code.

The bound is test_checkpoint_quant.py's: logits within ``MODEL_RTOL`` (1%) of the largest
logit of the dequantized model, teacher-forced greedy picks >= 99% equal. What separates
the two models is rounding, not the format: octavo's CPU blocks hold ``d`` and ``m`` in
fp16 (~0.1% of a weight), GPTQModel's dequantizer rounds to fp16 once; a wrong field order,
zero-point offset or group would move weights by whole quantization steps (a 4-bit step is
~7% of a group's range), far above it. Skipped where a tool's environment is not installed.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from octavo.models.loader import load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.models.test_checkpoint_quant import MODEL_RTOL, prompt_logits
from tests.core.models.tool_checkpoints import TOOL_SCHEMES, dense_folder, tool_checkpoints
from tests.core.tiny_models import VOCAB_SIZE

pytestmark = pytest.mark.usefixtures("single_thread")


# Measured below the 99%, left visible (strict: a pass would be news):
SHORT_OF_99 = {("gptqmodel", "gptq-4bit-act-order"): (
    "98.0%: 2 of 101 picks differ, both near-ties (the top two logits 0.0031 and 0.0052 "
    "apart, the logits up to 0.0134 off: the fp16 rounding of octavo's blocks, m = -z*s of "
    "asymmetric groups of 32, and of GPTQModel's fp16 dequantization)")}
PARAMS = [pytest.param(tool, scheme, id=f"{tool}-{scheme}", marks=[
    pytest.mark.xfail(strict=True, reason=SHORT_OF_99[tool, scheme])]
    if (tool, scheme) in SHORT_OF_99 else []) for tool, scheme in TOOL_SCHEMES]


@pytest.mark.parametrize(("tool", "scheme"), PARAMS)
def test_a_tool_checkpoint_matches_the_tools_dequantized_model(tool, scheme):
    checkpoint = tool_checkpoints(tool)[scheme]
    assert load_model_files(str(checkpoint.folder)).quantization == checkpoint.quant_method
    # the reference is quantized: the tool's dequantized weights are not the dense ones
    dense = load_file(dense_folder() / "model.safetensors")
    exact_weights = load_file(checkpoint.exact / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    assert (exact_weights[name] - dense[name]).abs().max() > 1e-3, "not quantized"
    gen = torch.Generator().manual_seed(draw_seed())
    prompts = [torch.randint(0, VOCAB_SIZE, (n,), generator=gen).tolist() for n in (37, 64)]
    exact = prompt_logits(checkpoint.exact, prompts, kernels=False)
    for kernels in (False, True):
        logits = prompt_logits(checkpoint.folder, prompts, kernels)
        diff = (logits - exact).abs().max().item()
        agree = (logits.argmax(-1) == exact.argmax(-1)).float().mean().item()
        print(f"{tool} {scheme} kernels={kernels}: logit diff {diff:.2e} "
              f"({diff / exact.abs().max():.3%} of the largest), greedy agreement {agree:.3f}")
        # a pick may differ only at a near-tie: where the dequantized model's top two
        # logits are within twice the largest logit difference
        top2 = exact.topk(2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1])[logits.argmax(-1) != exact.argmax(-1)]
        print(f"  top-two gaps where the picks differ: {gaps.tolist()}")
        assert diff < MODEL_RTOL * exact.abs().max(), f"{tool} {scheme}: {diff:.2e}"
        assert (gaps <= 2 * diff).all(), f"{tool} {scheme}: a pick differs at gap {gaps}"
        assert agree >= 0.99, f"{tool} {scheme}: greedy agreement {agree:.3f}"
