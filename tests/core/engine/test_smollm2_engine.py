"""Acceptance on the default model, SmolLM2-135M-Instruct (GGUF): the reference workloads
through ``LLM.generate`` against HF transformers, prefix caching on W3, and the CLI."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.bench.workloads import build_workload
from tests.core.parity import (
    compare,
    engine_forced_picks,
    engine_greedy,
    greedy_agreement,
    hf_forced,
    hf_greedy,
)
from tests.helpers import run_octavo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# W1 in full is 64 x (256 + 128) tokens; CI checks the first W1_REQUESTS of its prompts
# (benchmarks/parity_w1.py runs all 64), HF forced along our tokens (``hf_forced``: one
# forward pass a prompt instead of one a token).
W1_REQUESTS = 12


def test_w1_prompts_match_hf(smollm2_hf) -> None:  # type: ignore[no-untyped-def]
    workload = build_workload("W1_throughput")
    prompts = workload.prompts[:W1_REQUESTS]
    llm = LLM(dtype="float32", quantization="none", max_model_len=512,
              kv_cache_memory=256 * 2**20)
    ours = engine_greedy(llm, prompts, workload.output_len)
    reference = [hf_forced(smollm2_hf, p, tokens) for p, tokens in zip(prompts, ours[0])]
    report = compare(prompts, ours, reference)
    print(f"\nW1[:{W1_REQUESTS}] max per-step logit diff {report.max_logit_diff:.2e}; "
          f"tie divergences: {report.divergences or 'none'}")
    assert not report.failures, report.failures
    assert report.max_logit_diff < 1e-3


# bf16 (the CPU default where the CPU has native bf16) cannot match HF token for token -
# the two round differently - so it must agree on at least this share of greedy tokens
# (issue 10). Agreement is judged with teacher forcing: both follow HF bf16's greedy text and
# each step compares the engine's pick with HF's. Comparing two free-running generations
# instead measures how chaotic bf16 decoding is: after the first near-tie flips, the texts
# part and every later position counts against both (HF bf16 agrees with HF fp32 on ~55% of
# free-running tokens on these prompts, and on ~98% teacher-forced).
BF16_MIN_AGREEMENT = 0.9
BF16_REQUESTS = 6
BF16_TOKENS = 64
# 256 MiB: 728.2 bf16 blocks of SmolLM2 (368,640 bytes), 1456.4 fp8 ones.
BF16_ENGINE = dict(dtype="bfloat16", quantization="none", max_model_len=512,
                   kv_cache_memory=256 * 2**20)


@dataclass
class BF16Run:
    """W1[:6] on the engine in bf16 (a bf16 KV cache), its picks teacher-forced along HF
    bf16's greedy text: what the bf16 and the fp8 KV cache tests both judge."""

    llm: LLM
    prompts: list[list[int]]
    reference: list[list[int]]  # HF bf16's greedy tokens
    picks: list[list[int]]  # the engine's, forced along them


@pytest.fixture(scope="module")
def bf16_run(smollm2_hf) -> BF16Run:  # type: ignore[no-untyped-def]
    prompts = build_workload("W1_throughput").prompts[:BF16_REQUESTS]
    llm = LLM(**BF16_ENGINE)
    hf_bf16 = copy.deepcopy(smollm2_hf).to(torch.bfloat16)
    reference = [hf_greedy(hf_bf16, p, BF16_TOKENS)[0] for p in prompts]
    return BF16Run(llm, prompts, reference, engine_forced_picks(llm, prompts, reference))


def test_w1_prompts_bf16_agree_with_hf_bf16(bf16_run: BF16Run) -> None:
    forced = greedy_agreement(bf16_run.picks, bf16_run.reference)
    free = greedy_agreement(engine_greedy(bf16_run.llm, bf16_run.prompts, BF16_TOKENS)[0],
                            bf16_run.reference)
    print(f"\nW1[:{BF16_REQUESTS}] x {BF16_TOKENS} bf16 greedy agreement with HF bf16: "
          f"{forced:.1%} teacher-forced, {free:.1%} free-running")
    assert forced >= BF16_MIN_AGREEMENT


# --kv-cache-dtype fp8 (issue 52): the same budget holds twice the blocks, and at each step
# of HF bf16's greedy text the fp8 cache's pick mostly agrees with the bf16 cache's. The
# rate is e4m3's rounding of the keys at near-ties (docs/quantization.md, "Where the fp8
# error comes from"; benchmarks/fp8_kv_agreement.py): 97.7% on W1[:64] x 64 (4096 steps).
# These 384 steps are a sample of it, and which sample depends on the CPU, since HF bf16's
# text does (its bf16 matmuls differ from one CPU to another): 99.0% on the Intel Xeon
# guest, 97.4% on the AMD EPYC Zen 4 one. A bound of 98% (issue 52's acceptance, which the
# rate meets or misses by a few steps) failed there; the bound is three standard errors of
# a 384-step sample below the rate, so that only a real loss of accuracy fails it.
FP8_MIN_AGREEMENT = 0.95


def test_w1_fp8_kv_cache_doubles_the_blocks_and_agrees_with_bf16(bf16_run: BF16Run) -> None:
    fp8 = LLM(kv_cache_dtype="fp8", **BF16_ENGINE)
    assert fp8.llm_engine.core.executor.worker.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    blocks = fp8.llm_engine.core.num_blocks, bf16_run.llm.llm_engine.core.num_blocks
    assert blocks[0] == 2 * blocks[1]
    picks = engine_forced_picks(fp8, bf16_run.prompts, bf16_run.reference)
    agreement = greedy_agreement(picks, bf16_run.picks)
    print(f"\nW1[:{BF16_REQUESTS}] x {BF16_TOKENS}: the fp8 (e4m3) KV cache's greedy picks "
          f"agree with the bf16 cache's on {agreement:.1%}, teacher-forced; {blocks[0]} blocks "
          f"vs {blocks[1]} of the same budget")
    assert agreement >= FP8_MIN_AGREEMENT


def test_w3_prefix_cache_covers_the_shared_prefix() -> None:
    workload = build_workload("W3_shared_prefix")
    params = SamplingParams(temperature=0.0, max_tokens=workload.output_len, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    llm = LLM(dtype="float32", max_model_len=1024, kv_cache_memory=512 * 2**20)
    outputs = llm.generate(prompts, params)
    stats = llm.llm_engine.core.scheduler.make_stats().prefix_cache
    shared = workload.spec["shared_prefix_len"]
    later = workload.spec["num_requests"] - 1
    coverage = stats.hits / (later * shared)
    print(f"\nW3 prefix-cache hit rate {stats.hit_rate:.3f} of all prompt tokens; "
          f"{coverage:.3f} of the shared-prefix tokens of requests 2..{later + 1}")
    assert coverage >= 0.9
    assert sum(o.num_cached_tokens > 0 for o in outputs) >= later
    assert all(len(o.outputs[0].token_ids) == workload.output_len for o in outputs)


def test_octavo_generate_answers_on_the_default_model() -> None:
    result = run_octavo("generate", "What is the capital of France?", "--max-tokens", "24",
                        timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout, result.stdout
