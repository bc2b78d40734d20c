"""Acceptance (issue 50): fp32 greedy tokens with LoRA adapters equal HF transformers + PEFT.

One batch mixes four PEFT adapters (ranks 8 and 16, rsLoRA, one on a subset of the
projections) and the base model, with a small token budget (prompts prefilled in chunks
while others decode) and a KV cache too small for all of them (requests are preempted and
recomputed, adapter and all).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from octavo import LLM, LoRARequest
from octavo.testing.seeds import draw_seed
from tests.core.lora.peft_adapters import SPECS, make_adapter
from tests.core.parity import compare, engine_greedy, hf_greedy
from tests.core.tiny_models import save_tiny_model

PROMPT_LENGTHS = [5, 19, 33, 47, 61, 26, 12, 40, 70, 9]
MAX_TOKENS = 24


def count_preemptions(llm: LLM) -> list[int]:
    """A counter of the scheduler's preemptions (it calls ``_preempt`` for each)."""
    scheduler = llm.llm_engine.core.scheduler
    count = [0]
    original = scheduler._preempt

    def counted(request):  # type: ignore[no-untyped-def]
        count[0] += 1
        return original(request)

    scheduler._preempt = counted
    return count


def test_tiny_qwen3_mixed_adapters_match_peft(tmp_path: Path) -> None:
    seed = draw_seed()
    base = save_tiny_model("qwen3", tmp_path / "base", seed)
    adapters = [make_adapter(base, spec, tmp_path / f"lora{i}", seed + i)
                for i, spec in enumerate(SPECS)]
    requests = [LoRARequest(f"lora{i}", i + 1, str(tmp_path / f"lora{i}"))
                for i in range(len(SPECS))]
    llm = LLM(model=str(tmp_path / "base"), dtype="float32", enable_lora=True, max_loras=4,
              max_lora_rank=16, max_num_batched_tokens=32, max_num_seqs=10, block_size=16,
              max_model_len=128,
              kv_cache_memory=400 * 1024)
    preemptions = count_preemptions(llm)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, base.config.vocab_size, size=n).tolist()
               for n in PROMPT_LENGTHS]
    # Prompt i runs with adapter i % 5 (4: the base model).
    loras = [requests[i % 5] if i % 5 < 4 else None for i in range(len(prompts))]
    models = [adapters[i % 5] if i % 5 < 4 else base for i in range(len(prompts))]
    ours = engine_greedy(llm, prompts, MAX_TOKENS, loras)
    reference = [hf_greedy(model, prompt, MAX_TOKENS) for model, prompt in zip(models, prompts)]
    report = compare(prompts, ours, reference)
    print(f"\ntiny qwen3 + 4 adapters (seed {seed}): max logit diff "
          f"{report.max_logit_diff:.2e}; preemptions {preemptions[0]}; ties "
          f"{report.divergences or 'none'}")
    assert preemptions[0] > 0, f"seed {seed}: no request was preempted; shrink the KV cache"
    assert not report.failures, f"seed {seed}: divergences beyond a tie: {report.failures}"
    assert report.max_logit_diff < 1e-3, f"seed {seed}: logit diff {report.max_logit_diff:.2e}"
    # Each adapter changes the tokens: a delta dropped on the way would pass unnoticed else.
    base_tokens = [hf_greedy(base, prompt, MAX_TOKENS)[0] for prompt in prompts[:4]]
    assert all(ours[0][i] != base_tokens[i] for i in range(4)), f"seed {seed}"

