"""Runs a compare.py job on vLLM (its CPU build): ``LLM.generate`` over token-id prompts,
greedy, ``ignore_eos`` so each request yields exactly ``output_len`` tokens. Run it with the
Python of the virtual environment vLLM is installed in (see benchmarks/README.md)."""

from __future__ import annotations

from job import load_job, measure, parse_args
from vllm import LLM, SamplingParams

VLLM_CPU_DEFAULT_KV_BYTES = 4 * 2**30  # VLLM_CPU_KVCACHE_SPACE's default, 4 GiB


def main() -> None:
    args = parse_args(__doc__)
    job = load_job(args.job)
    # Always an explicit KV-cache size: otherwise vLLM's CPU backend reserves a fraction of
    # all RAM and refuses to start when other processes hold part of it.
    kv_bytes = job["kv_cache_bytes"] or VLLM_CPU_DEFAULT_KV_BYTES
    llm = LLM(model=job["model"], dtype=job["dtype"], seed=0, kv_cache_memory_bytes=kv_bytes,
              enable_prefix_caching=job["enable_prefix_caching"])

    def generate(prompts: list[list[int]], output_len: int) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outputs]

    measure("vllm", job, args.output_json, generate)


if __name__ == "__main__":
    main()
