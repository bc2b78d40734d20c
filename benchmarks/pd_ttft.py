"""Decode-instance TTFT on W3-style prompts (a shared 512-token prefix + 32 unique tokens):
prompt KV loaded through a KV connector versus computed.

    python benchmarks/pd_ttft.py [--model PATH] [--num-prompts 8] [--connector shared_storage]

1. A producer engine (``role: producer``) computes every prompt once (``max_tokens=1``), as
   a prefill instance does, saving its KV.
2. A consumer engine (``role: consumer``) answers each prompt alone with ``max_tokens=1``:
   its time is the decode instance's TTFT with the prefix loaded.
3. A plain engine answers the same prompts: the TTFT of recomputing them.

Prefix caching is off in all three, so each timed request really loads or really computes
its prompt (with it on, the plain engine would reuse the shared prefix after request one).
One warm-up prompt per engine is not timed. Without ``--model``: SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from octavo import LLM, SamplingParams


def make_prompts(num: int, prefix_len: int, suffix_len: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(1000, 30000, prefix_len).tolist()
    return [prefix + rng.integers(1000, 30000, suffix_len).tolist() for _ in range(num + 1)]


def time_each(llm: LLM, prompts: list[list[int]]) -> list[float]:
    """Seconds to the first token of each prompt, one request at a time (first one untimed)."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    times = []
    for index, prompt in enumerate(prompts):
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        if index:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--connector", default="shared_storage",
                        help="shared_storage (a temporary directory) or a full JSON config "
                             "without the role")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    prompts = make_prompts(args.num_prompts, args.prefix_len, args.suffix_len, args.seed)
    engine: dict[str, Any] = {"model": args.model, "dtype": "float32",
                              "kv_cache_memory": 256 * 2**20, "enable_prefix_caching": False,
                              "max_model_len": 2048}
    with tempfile.TemporaryDirectory() as store:
        connector = ({"connector": "shared_storage", "path": store}
                     if args.connector == "shared_storage" else json.loads(args.connector))
        producer = LLM(**engine, kv_transfer_config={**connector, "role": "producer"})
        producer.generate([{"prompt_token_ids": p} for p in prompts],
                          SamplingParams(max_tokens=1), use_tqdm=False)
        del producer
        consumer = LLM(**engine, kv_transfer_config={**connector, "role": "consumer"})
        loaded = time_each(consumer, prompts)
        stats = consumer.llm_engine.core.scheduler.make_stats().kv_transfer
        del consumer
    recomputing = LLM(**engine)
    computed = time_each(recomputing, prompts)

    print(f"\n{args.num_prompts} prompts of {args.prefix_len} shared + {args.suffix_len} unique "
          f"tokens; consumer loaded {stats.loaded_tokens} tokens in {stats.loads} loads "
          f"({stats.failed_loads} failed)")
    print(f"{'decode TTFT':<26}{'median ms':>12}{'mean ms':>12}")
    for name, times in (("prefix loaded (connector)", loaded), ("recomputed", computed)):
        print(f"{name:<26}{1000 * statistics.median(times):>12.1f}"
              f"{1000 * statistics.mean(times):>12.1f}")
    print(f"speed-up (median): {statistics.median(computed) / statistics.median(loaded):.2f}x")


if __name__ == "__main__":
    main()
