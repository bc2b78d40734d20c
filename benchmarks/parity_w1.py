"""Greedy parity of ``LLM.generate`` with HF transformers on the whole W1 workload.

CI checks the first prompts of W1 (tests/core/test_smollm2_engine.py); this runs all 64
prompts x 128 tokens - minutes on a CPU - and prints the report:

    .venv/bin/python benchmarks/parity_w1.py [--requests 64]
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
from tests.core.parity import compare, engine_greedy, hf_greedy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    workload = build_workload("W1_throughput")
    prompts = workload.prompts[: args.requests]
    start = time.perf_counter()
    llm = LLM(dtype="float32", max_model_len=512, kv_cache_memory=2**30)
    ours = engine_greedy(llm, prompts, workload.output_len)
    engine_s = time.perf_counter() - start
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    reference = [hf_greedy(hf, p, workload.output_len) for p in tqdm(prompts, desc="HF")]
    report = compare(prompts, ours, reference)
    identical = len(prompts) - len(report.divergences) - len(report.failures)
    print(f"W1 parity, {len(prompts)} prompts x {workload.output_len} greedy tokens (fp32):")
    print(f"  identical sequences:        {identical}/{len(prompts)}")
    print(f"  divergences at a tie:       {report.divergences or 'none'}")
    print(f"  divergences beyond a tie:   {report.failures or 'none'}")
    print(f"  max per-step logit diff:    {report.max_logit_diff:.2e}")
    print(f"  octavo time (load + run):   {engine_s:.1f} s")
    sys.exit(1 if report.failures or report.max_logit_diff >= 1e-3 else 0)


if __name__ == "__main__":
    main()
