"""LoRA under tensor parallelism (issue 50): A/B sharded as their base layers (column-
parallel: B on its output rows; row-parallel: A on its input columns) give the tokens of
one rank, for a batch mixing two PEFT adapters and the base model. Tiny Qwen3 with 8 query
and 2 KV heads at TP=2 (one KV head per rank)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from octavo import LoRARequest
from octavo.testing.seeds import draw_seed

from ..core.lora.peft_adapters import SPECS, make_adapter
from ..core.tiny_models import save_tiny_model
from .engines import max_logprob_gap, one_thread, run
from .test_tensor_parallel import LOGPROB_TOLERANCE, random_prompts


def test_lora_tp2_matches_one_rank(tmp_path: Path) -> None:
    seed = draw_seed()
    base = save_tiny_model("qwen3", tmp_path / "base", seed, num_attention_heads=8,
                           num_key_value_heads=2)
    adapters = []
    for index, spec in enumerate(SPECS[1:3]):  # rank 16 rsLoRA, and a subset of modules
        make_adapter(base, spec, tmp_path / f"lora{index}", seed + index)
        adapters.append(LoRARequest(f"lora{index}", index + 1, str(tmp_path / f"lora{index}")))
    prompts = random_prompts(np.random.default_rng(seed), 6)
    loras = [adapters[0], adapters[1], None] * 2
    engine = dict(enable_lora=True, max_loras=2, max_lora_rank=16)
    with one_thread():
        reference = run(str(tmp_path / "base"), prompts, 16, loras, **engine)
    parallel = run(str(tmp_path / "base"), prompts, 16, loras, tensor_parallel_size=2,
                   **engine)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert max_logprob_gap(parallel, reference) < LOGPROB_TOLERANCE, f"seed {seed}"
