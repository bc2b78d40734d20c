"""Acceptance of issue 53 on a decoder: SmolLM2-135M-Instruct (the default model) in the
pooling runner with last-token pooling equals HF transformers' last hidden state at the
last position, normalised, within 1e-4 in fp32 - with a prompt computed in chunks, and one
whose prefix comes from the prefix cache (LAST pooling keeps both)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo import LLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LONG = ("Retrieval systems embed every document once and every query as it arrives, then "
        "rank documents by the cosine of the angle between the two vectors. ")
PROMPTS = ["The capital of France is", LONG * 2, "hi", LONG * 2 + "Which one ranks first?"]
CHUNK = 32  # the token budget: the long prompts (~60 tokens) are computed in chunks


def test_smollm2_last_token_pooling_matches_hf(smollm2_hf) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(runner="pooling", dtype="float32", quantization="none", max_model_len=512,
              kv_cache_memory=64 * 2**20, max_num_batched_tokens=CHUNK)
    first = llm.embed(PROMPTS[:3], use_tqdm=False)
    last = llm.embed(PROMPTS[3:], use_tqdm=False)  # its first blocks: the cached LONG * 2
    assert llm.llm_engine.core.scheduler.kv_manager.prefix_stats.hits >= 3 * 16
    worst = 0.0
    for output in first + last:
        ids = output.prompt_token_ids
        with torch.no_grad():
            hidden = smollm2_hf.model(torch.tensor([ids])).last_hidden_state[0, -1]
        ours = torch.tensor(output.outputs.embedding)
        worst = max(worst, float((ours - F.normalize(hidden, dim=0)).abs().max()))
    print(f"\nSmolLM2 last-token pooling vs HF: max |diff| {worst:.2e} over "
          f"{[len(o.prompt_token_ids) for o in first + last]} tokens")
    assert max(len(o.prompt_token_ids) for o in first) > CHUNK
    assert worst < 1e-4
    llm.shutdown()
