"""Runs a compare.py job on vLLM (its CPU build): ``LLM.generate`` over token-id prompts,
greedy, ``ignore_eos`` so each request yields exactly ``output_len`` tokens. Run it with the
Python of the virtual environment vLLM is installed in (see benchmarks/README.md)."""

from __future__ import annotations

import time

from job import WARMUP_OUTPUT_LEN, load_job, parse_args, write_result
from vllm import LLM, SamplingParams


def generate(llm: LLM, prompts: list[list[int]], output_len: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [len(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    args = parse_args(__doc__)
    job = load_job(args.job)
    # An explicit KV-cache size, as Octavo gets: otherwise vLLM's CPU backend reserves a
    # fraction of all RAM and refuses to start when other processes hold part of it.
    llm = LLM(model=job["model"], dtype=job["dtype"], seed=0,
              kv_cache_memory_bytes=job["kv_cache_bytes"])
    generate(llm, [job["warmup_prompt"]], WARMUP_OUTPUT_LEN)
    start = time.perf_counter()
    output_lens = generate(llm, job["prompts"], job["output_len"])
    wall = time.perf_counter() - start
    write_result(args.output_json, "vllm", wall, job["prompts"], output_lens)


if __name__ == "__main__":
    main()
