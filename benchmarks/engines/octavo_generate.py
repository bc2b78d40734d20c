"""Runs a compare.py job on Octavo: ``LLM.generate`` over token-id prompts, greedy,
``ignore_eos`` so each request yields exactly ``output_len`` tokens - the same calls as the
vLLM runner, so both engines are timed alike."""

from __future__ import annotations

from job import load_job, measure, parse_args

from octavo import LLM, SamplingParams


def main() -> None:
    args = parse_args(__doc__)
    job = load_job(args.job)
    kwargs = {} if job["kv_cache_bytes"] is None else {"kv_cache_memory": job["kv_cache_bytes"]}
    llm = LLM(model=job["model"], dtype=job["dtype"], seed=0,
              enable_prefix_caching=job["enable_prefix_caching"], **kwargs)

    def generate(prompts: list[list[int]], output_len: int) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outputs]

    measure("octavo", job, args.output_json, generate)


if __name__ == "__main__":
    main()
