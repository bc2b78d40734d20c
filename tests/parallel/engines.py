"""Running the same prompts through an engine at different parallel sizes, for comparison:
greedy tokens and the first step's top logprobs (prompt logprobs: every prompt position of
the prefill step, i.e. that step's logits, through a log-softmax)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from octavo import LLM, LoRARequest, RequestOutput, SamplingParams

TOP_LOGPROBS = 20
KV_BYTES = 1 << 25  # per rank: the tests' prompts are short


@dataclass
class Run:
    tokens: list[list[int]]
    # Per prompt, per prompt position after the first: {token id: logprob} of the top 20.
    prompt_logprobs: list[list[dict[int, float]]]


@contextmanager
def one_thread():
    """Single-threaded in this process, as each worker process is on its own core: the same
    GEMM blocking, so the same arithmetic."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_llm(model: str, **engine: Any) -> LLM:
    """The engine the comparisons run: fp32, a small KV cache, a fixed seed (``engine``
    may override them)."""
    settings: dict[str, Any] = dict(dtype="float32", kv_cache_memory=KV_BYTES,
                                    max_model_len=512, seed=0)
    return LLM(model, **(settings | engine))


def run(model: str, prompts: list[list[int]], max_tokens: int,
        loras: list[LoRARequest | None] | None = None, **engine: Any) -> Run:
    """Greedy generation of ``max_tokens`` per prompt (``loras``: each prompt's LoRA
    adapter); the engine is shut down after."""
    llm = make_llm(model, **engine)
    try:
        return generate(llm, prompts, max_tokens, loras)
    finally:
        llm.shutdown()


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int,
             loras: list[LoRARequest | None] | None = None) -> Run:
    """Greedy generation of ``max_tokens`` per prompt on a running engine."""
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens),
                           use_tqdm=False, lora_request=loras)
    return to_run(outputs)


def run_staggered(model: str, prompts: list[list[int]], max_tokens: int, per_step: int = 3,
                  **engine: Any) -> tuple[Run, int]:
    """Greedy generation with ``per_step`` new requests added before each engine step (a
    server's traffic): steps mix prompts with decodes, and requests finish a few at a time,
    so the workers' batch rows move. Returns the run and the most requests that finished
    in one step (the move that once set the tensor ranks' rows apart)."""
    llm = make_llm(model, **engine)
    try:
        core = llm.llm_engine
        params = greedy(max_tokens)
        pending = list(enumerate(prompts))
        done: dict[int, RequestOutput] = {}
        most_finished = 0
        while pending or core.has_unfinished_requests():
            for i, prompt in pending[:per_step]:
                core.add_request({"prompt_token_ids": prompt}, params, request_id=str(i))
            del pending[:per_step]
            finished = [o for o in core.step() if isinstance(o, RequestOutput) and o.finished]
            done.update((int(o.request_id), o) for o in finished)
            most_finished = max(most_finished, len(finished))
        return to_run([done[i] for i in range(len(prompts))]), most_finished
    finally:
        llm.shutdown()


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy, ``max_tokens`` exactly, the top logprobs of every prompt position."""
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                          prompt_logprobs=TOP_LOGPROBS)


def to_run(outputs: list[RequestOutput]) -> Run:
    """The tokens and prompt logprobs of finished outputs, in the prompts' order."""
    return Run(
        tokens=[o.outputs[0].token_ids for o in outputs],
        prompt_logprobs=[[{t: lp.logprob for t, lp in position.items()}
                          for position in o.prompt_logprobs[1:]] for o in outputs])


def max_logprob_gap(a: Run, b: Run) -> float:
    """The largest difference of a logprob both runs report (same top tokens required)."""
    gap = 0.0
    for prompt_a, prompt_b in zip(a.prompt_logprobs, b.prompt_logprobs, strict=True):
        for pos_a, pos_b in zip(prompt_a, prompt_b, strict=True):
            shared = pos_a.keys() & pos_b.keys()
            assert len(shared) >= TOP_LOGPROBS - 2, "the top tokens differ"
            gap = max(gap, max(abs(pos_a[t] - pos_b[t]) for t in shared))
    return gap
