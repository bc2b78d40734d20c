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

from octavo.testing import quant_checkpoints as qc
from octavo.testing.seeds import draw_seed

from ..core.models.test_checkpoint_quant import FORMATS
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
