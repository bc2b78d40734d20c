"""``octavo bench throughput``: every request submitted at once, the engine left to batch them
as it likes; how many requests and tokens per second it gets through (vLLM's
``bench throughput``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from octavo.bench.datasets import BenchRequest
from octavo.bench.offline import generate, warm_up
from octavo.engine.llm import LLM
from octavo.sampling_params import StructuredOutputsParams


@dataclass
class ThroughputResult:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int  # prompt tokens the prefix cache served
    elapsed_time: float  # seconds, first submission to last completion

    @property
    def requests_per_second(self) -> float:
        return self.num_requests / self.elapsed_time

    @property
    def output_tokens_per_second(self) -> float:
        return self.output_tokens / self.elapsed_time

    @property
    def tokens_per_second(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_time

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens

    def to_json(self) -> dict[str, Any]:
        """vLLM's keys (``elapsed_time``, ``num_requests``, ``total_num_tokens``,
        ``requests_per_second``, ``tokens_per_second``) plus Octavo's."""
        return {**asdict(self), "total_num_tokens": self.prompt_tokens + self.output_tokens,
                "requests_per_second": self.requests_per_second,
                "tokens_per_second": self.tokens_per_second,
                "output_tokens_per_second": self.output_tokens_per_second,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate}


def run_throughput(llm: LLM, requests: list[BenchRequest],
                   structured: StructuredOutputsParams | None = None) -> ThroughputResult:
    """With ``structured``, every request is guided by it (to measure that overhead)."""
    warm_up(llm, structured)
    start = time.perf_counter()
    outputs = generate(llm, requests, structured=structured)
    elapsed = time.perf_counter() - start
    return ThroughputResult(
        num_requests=len(requests),
        prompt_tokens=sum(len(o.prompt_token_ids) for o in outputs),
        output_tokens=sum(len(c.token_ids) for o in outputs for c in o.outputs),
        cached_prompt_tokens=sum(o.num_cached_tokens for o in outputs),
        elapsed_time=elapsed,
    )
