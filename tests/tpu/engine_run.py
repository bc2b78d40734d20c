"""One engine run in a subprocess, reported as JSON: what the TPU tests compare.

``python -m tests.tpu.engine_run MODEL BACKEND ENGINE_JSON [TP]`` generates greedy tokens
for ``PROMPTS`` (one with ``logprobs``) and reports, besides the tokens, what the worker
was handed (requests resumed after preemption, prefix-cache hits at first sight, prompt
chunks that sampled nothing) and, on the tpu backend, the compile guard's count and the
start-up compile time. A second batch runs the sampler's other paths: greedy under
penalties, logit_bias, allowed_token_ids and min_tokens (deterministic, so the backends
must agree), and seeded random sampling twice (each backend must repeat itself). A
subprocess because interpret mode (and a 2-device CPU mesh) are fixed when JAX and the
plugin are imported.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SHARED_PREFIX = list(range(40, 60))  # 20 tokens: its first block is cached for the others
PROMPTS = [list(range(10, 15)), list(range(100, 123)), SHARED_PREFIX + [7, 8, 9], [5],
           SHARED_PREFIX + [3], list(range(200, 231)), list(range(60, 70)),
           SHARED_PREFIX + list(range(1, 9))]
MAX_TOKENS = 16
LOGPROBS = 3  # asked for by the first prompt
# One token bucket (8) and three request buckets: prompts longer than 8 tokens are chunked.
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 8, "max_num_seqs": 4,
          "max_model_len": 64}


# Greedy over processed logits: what the sampler's dense variant computes, row by row.
PROCESSED = [
    {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3,
     "logprobs": LOGPROBS},
    {"logit_bias": {7: 2.5, 11: -100.0}, "min_tokens": 6, "stop_token_ids": [3]},
    {"allowed_token_ids": list(range(20, 60))},
]
EXTRA_TOKENS = 8  # per request of the second batch
PROCESSED = [{"max_tokens": EXTRA_TOKENS, "temperature": 0.0, **s} for s in PROCESSED]
# Seeded random rows beside a greedy one: the same tokens on every run.
SEEDED = [{"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7}, {"temperature": 0.0},
          {"temperature": 1.2, "min_p": 0.05, "seed": 123}]
SEEDED = [{"max_tokens": EXTRA_TOKENS, "ignore_eos": True, **s} for s in SEEDED]


def logprob_steps(steps: Any) -> list[dict[str, list[float]]]:
    return [{str(k): [v.logprob, v.rank] for k, v in step.items()} for step in steps]


def kv_block_bytes(hf_config: dict[str, Any], dtype_bytes: int = 4) -> int:
    """Bytes of one 16-token KV block of all layers, to size a budget in blocks."""
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    kv_heads = hf_config.get("num_key_value_heads") or heads
    return 16 * 2 * kv_heads * head_dim * dtype_bytes * hf_config["num_hidden_layers"]


class Watch:
    """Wraps the executor's ``execute_model`` to see the plain data crossing the boundary."""

    def __init__(self, executor: Any) -> None:
        self.resumed = self.prefix_hits = self.chunks = 0
        self._execute = executor.execute_model
        executor.execute_model = self

    def __call__(self, scheduler_output: Any) -> Any:
        for new in scheduler_output.scheduled_new_reqs:
            self.resumed += bool(new.output_token_ids)
            self.prefix_hits += new.num_computed_tokens > 0 and not new.output_token_ids
        output = self._execute(scheduler_output)
        self.chunks += sum(not tokens for tokens in output.sampled_token_ids)
        return output


def main(model: str, backend: str, engine: dict[str, Any], tp: int = 1,
         sampling: int = 1) -> dict[str, Any]:
    """The report; ``sampling`` 0 leaves out the second batch (the sampler's other paths)."""
    from octavo import LLM, SamplingParams

    llm = LLM(model=model, backend=backend, tensor_parallel_size=tp, **engine)
    executor = llm.llm_engine.core.executor
    watch = Watch(executor)
    plain = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with_logprobs = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                   logprobs=LOGPROBS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           [with_logprobs] + [plain] * (len(PROMPTS) - 1), use_tqdm=False)
    first = outputs[0].outputs[0].logprobs
    report: dict[str, Any] = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "logprobs": logprob_steps(first),
        "resumed": watch.resumed, "prefix_hits": watch.prefix_hits, "chunks": watch.chunks,
    }
    if sampling:
        report |= sampler_paths(llm)
    if sampling and backend == "tpu":
        report["refusals"] = refusals(llm)
    if backend == "tpu":
        runner = executor.worker.runner
        report["compiles_while_serving"] = runner.guard.compiles_while_serving
        report["startup_compile_seconds"] = runner.startup_compile_seconds
        report["devices"] = len(runner.placement.mesh.devices.flat)
    return report


def sampler_paths(llm: Any) -> dict[str, Any]:
    """The second batch: ``PROCESSED`` once and ``SEEDED`` twice."""
    from octavo import SamplingParams

    processed = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:len(PROCESSED)]],
                             [SamplingParams(**settings) for settings in PROCESSED],
                             use_tqdm=False)
    seeded = [llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:len(SEEDED)]],
                           [SamplingParams(**settings) for settings in SEEDED], use_tqdm=False)
              for _ in range(2)]
    return {
        "processed_tokens": [list(o.outputs[0].token_ids) for o in processed],
        "processed_logprobs": logprob_steps(processed[0].outputs[0].logprobs),
        "seeded_tokens": [[list(o.outputs[0].token_ids) for o in run] for run in seeded],
    }


# What the tpu platform refuses (``TpuPlatform.validate_request``), each beside ordinary
# requests; prompt_embeds only at the core (the front end refuses them for want of
# --enable-prompt-embeds before the platform is asked).
REFUSED = {
    "prompt_logprobs": {"prompt_logprobs": 1},
    "structured_outputs": {"structured_outputs": {"regex": "[ab]+"}},
    "logprobs > 20": {"logprobs": 21},
}


def refusals(llm: Any) -> dict[str, Any]:
    """The first prompts served greedily while every refused kind is sent beside them, to
    the front end (``LLMEngine.add_request``) and straight to the engine core (as from a
    front end without the plugin): what each refusal said, and the ordinary tokens."""
    import numpy as np

    from octavo import SamplingParams
    from octavo.engine.errors import InvalidRequestError
    from octavo.request import Request
    from octavo.sampling_params import StructuredOutputsParams

    engine = llm.llm_engine
    plain = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    said: dict[str, list[str]] = {}
    ids = []
    for i, prompt in enumerate(PROMPTS[:3]):
        ids.append(engine.add_request({"prompt_token_ids": prompt}, SamplingParams(**plain),
                                      f"ordinary{i}"))
        for kind, settings in REFUSED.items():
            if "structured_outputs" in settings:
                settings = {"structured_outputs": StructuredOutputsParams(
                    **settings["structured_outputs"])}
            params = SamplingParams(**plain, **settings)
            try:
                engine.add_request({"prompt_token_ids": prompt}, params, f"{kind}{i}")
            except InvalidRequestError as exc:
                said.setdefault(kind, []).append(f"front end: {exc}")
            try:
                engine.core.add_request(Request(f"raw-{kind}{i}", prompt, params))
            except ValueError as exc:
                said.setdefault(kind, []).append(f"core: {exc}")
        embeds = Request(f"raw-embeds{i}", prompt, SamplingParams(**plain),
                         prompt_embeds=np.ones((len(prompt), 8), np.float32))
        try:
            engine.core.add_request(embeds)
        except ValueError as exc:
            said.setdefault("prompt_embeds", []).append(f"core: {exc}")
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = list(output.outputs[0].token_ids)
    return {"said": said, "finished": sorted(tokens),
            "tokens": [tokens.get(request_id) for request_id in ids]}


if __name__ == "__main__":
    args = sys.argv[1:]
    result = main(args[0], args[1], json.loads(args[2]), *map(int, args[3:]))
    print(json.dumps(result))
