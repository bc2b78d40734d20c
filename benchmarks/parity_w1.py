"""Greedy parity of ``LLM.generate`` with HF transformers on the whole W1 workload.

CI checks the first prompts of W1 (tests/core/engine/test_smollm2_engine.py); this runs all 64
prompts x 128 tokens - minutes on a CPU - and prints the report:

    .venv/bin/python benchmarks/parity_w1.py [--requests 64] [--dtype bfloat16]

In fp32 the tokens must match (a divergence only at a numerical tie) with logits within
1e-3. In bf16 both engines run bf16 and round differently, so the figure is the share of
HF bf16's greedy tokens the engine also picks when both follow HF's text (teacher forcing),
which must be >= 90%; the share equal at the same position in two free-running texts is
printed beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo import LLM  # noqa: E402
from octavo.bench.workloads import build_workload  # noqa: E402
from octavo.models.loader import default_model_path  # noqa: E402
from tests.core.parity import (  # noqa: E402
    compare,
    engine_forced_picks,
    engine_greedy,
    greedy_agreement,
    hf_greedy,
)

BF16_MIN_AGREEMENT = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--tokens", type=int, default=None,
                        help="greedy tokens per prompt (default: W1's output length, 128)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    workload = build_workload("W1_throughput")
    prompts = workload.prompts[: args.requests]
    tokens = args.tokens or workload.output_len
    start = time.perf_counter()
    llm = LLM(dtype=args.dtype, max_model_len=512, kv_cache_memory=2**30)
    ours = engine_greedy(llm, prompts, tokens)
    engine_s = time.perf_counter() - start
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval().to(dtype)
    reference = [hf_greedy(hf, p, tokens) for p in tqdm(prompts, desc="HF")]
    if dtype == torch.bfloat16:
        hf_tokens = [tokens for tokens, _ in reference]
        forced = greedy_agreement(engine_forced_picks(llm, prompts, hf_tokens), hf_tokens)
        free = greedy_agreement(ours[0], hf_tokens)
        total = len(prompts) * tokens
        print(f"W1 bf16 agreement with HF bf16, {len(prompts)} prompts x {tokens} greedy "
              f"tokens: {forced:.2%} teacher-forced ({round(forced * total)}/{total}), "
              f"{free:.2%} free-running (octavo load + run {engine_s:.1f} s)")
        sys.exit(0 if forced >= BF16_MIN_AGREEMENT else 1)
    report = compare(prompts, ours, reference)
    identical = len(prompts) - len(report.divergences) - len(report.failures)
    print(f"W1 parity, {len(prompts)} prompts x {tokens} greedy tokens (fp32):")
    print(f"  identical sequences:        {identical}/{len(prompts)}")
    print(f"  divergences at a tie:       {report.divergences or 'none'}")
    print(f"  divergences beyond a tie:   {report.failures or 'none'}")
    print(f"  max per-step logit diff:    {report.max_logit_diff:.2e}")
    print(f"  octavo time (load + run):   {engine_s:.1f} s")
    sys.exit(1 if report.failures or report.max_logit_diff >= 1e-3 else 0)


if __name__ == "__main__":
    main()
