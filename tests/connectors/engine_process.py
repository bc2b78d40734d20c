"""One offline engine in its own process, as a producer or consumer engine of a KV
connector would run: ``python -m tests.connectors.engine_process MODEL PROMPTS.json
[KV_TRANSFER_CONFIG] [--wait] [--hold] [--tp=N]``.

Prints one JSON line: the greedy output token ids per prompt, each request's
``num_cached_tokens`` and the engine's KV-transfer counters. With ``--wait`` it prints
``ready`` once the engine is built and generates after a line on stdin (the test can break
the transfer path in between); with ``--hold`` it stays alive after generating until its
stdin closes (a Mooncake producer's KV lives in its own memory segment). ``--tp=N`` runs N
tensor-parallel worker processes.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

from octavo import LLM, SamplingParams

MAX_TOKENS = 8


def main(argv: list[str]) -> None:
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if a not in flags]
    tp = next((int(f.removeprefix("--tp=")) for f in flags if f.startswith("--tp=")), 1)
    model, prompts_file = args[0], args[1]
    kv_transfer_config = args[2] if len(args) > 2 else None
    torch.set_num_threads(1)
    llm = LLM(model=model, dtype="float32", kv_cache_memory=8 * 2**20 // tp,
              kv_transfer_config=kv_transfer_config, tensor_parallel_size=tp)
    prompts = json.loads(open(prompts_file).read())
    if "--wait" in flags:
        print("ready", flush=True)
        sys.stdin.readline()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                           use_tqdm=False)
    stats = llm.llm_engine.core.scheduler.make_stats()
    print(json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                      "num_cached_tokens": [o.num_cached_tokens for o in outputs],
                      "kv_transfer": dataclasses.asdict(stats.kv_transfer)}), flush=True)
    if "--hold" in flags:
        sys.stdin.read()
    llm.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
