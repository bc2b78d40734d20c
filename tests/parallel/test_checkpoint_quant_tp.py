"""Tensor parallelism on a quantized safetensors checkpoint (issue 52): an AWQ checkpoint
split over two ranks gives one rank's greedy tokens: column-parallel ranks keep their rows
of the integers, scales and zeros, row-parallel ones (o_proj, down_proj) their groups.

Act-order (GPTQ ``desc_act``) on a row split is checked at the layer level
(test_checkpoint_quant.py): a rank keeps every group's scales and its slice of ``g_idx``,
and where its columns of a group are not whole blocks of 32 it multiplies the exact
dequantized weight, not the fp16-rounded blocks one rank holds, so its logits differ from
one rank's by that rounding (about 0.2% of the largest logit) and greedy tokens may differ
at near-ties: not a same-tokens check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octavo.testing import quant_checkpoints as qc
from octavo.testing.seeds import draw_seed

from ..core.models.test_checkpoint_quant import FORMATS
from ..core.models.tool_checkpoints import tool_checkpoints
from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run
from .test_tensor_parallel import LOGPROB_TOLERANCE, random_prompts

NAME = "awq-g32"


def test_awq_tp2_matches_one_rank(tmp_path: Path) -> None:
    seed = draw_seed()
    save_tiny_model("llama", tmp_path / "dense", seed, hidden_size=128, head_dim=32,
                    intermediate_size=256)
    quantizer, config = FORMATS[NAME]
    qc.quantize_folder(tmp_path / "dense", tmp_path / "q", tmp_path / "exact",
                       tmp_path / "blocks", quantizer, config)
    prompts = random_prompts(np.random.default_rng(seed), 4)
    with one_thread():
        reference = run(str(tmp_path / "q"), prompts, 8, max_model_len=128)
    parallel = run(str(tmp_path / "q"), prompts, 8, tensor_parallel_size=2, max_model_len=128)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE, f"seed {seed}"


@pytest.mark.parametrize("kernels", [
    "0", pytest.param("1", marks=pytest.mark.xfail(strict=True, reason=(
        "found here, not resolved: on the CPU's quantized kernels TP=2's greedy tokens "
        "differ from one rank's")))])
def test_llmcompressor_w4a16_tp2_matches_one_rank(kernels: str, monkeypatch) -> None:
    """llm-compressor's own W4A16 checkpoint (GPTQ, groups of 64: whole groups on each
    rank's half of o_proj's and down_proj's inputs) at TP=2 gives one rank's tokens on the
    portable path (``OCTAVO_CPU_KERNELS=0``, which the workers inherit). On the quantized
    kernels it does not (xfail, to be found out): on a second tiny Llama (seed 1234, by hand)
    TP=2 gave the portable path's tokens and one rank differed from both from the second
    token of one prompt - unless one rank's ``quant_gemm.Q8_ACTIVATIONS`` was off, when it
    gave them too: the TP=2 workers' decode steps do not seem to run the Q8-activation
    kernel that one rank runs. Skipped where llm-compressor's environment is not installed
    (tool_checkpoints.py)."""
    monkeypatch.setenv("OCTAVO_CPU_KERNELS", kernels)
    folder = str(tool_checkpoints("llmcompressor")["w4a16"].folder)
    seed = draw_seed()
    prompts = random_prompts(np.random.default_rng(seed), 4)
    with one_thread():
        reference = run(folder, prompts, 8, max_model_len=128)
    parallel = run(folder, prompts, 8, tensor_parallel_size=2, max_model_len=128)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE, f"seed {seed}"
