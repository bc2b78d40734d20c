"""``octavo bench latency``: how long one batch takes from submission to its last token,
measured over repeated iterations after warm-up ones (vLLM's ``bench latency``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from octavo.bench.datasets import BenchRequest
from octavo.bench.offline import generate, warm_up
from octavo.engine.llm import LLM
from octavo.stats import SpecDecodingStats, spec_summary

LATENCY_PERCENTILES = (10, 25, 50, 75, 90, 99)


@dataclass
class LatencyResult:
    batch_size: int
    input_len: int
    output_len: int
    latencies: list[float]  # seconds per measured iteration, submission to last token
    ttfts: list[float]  # seconds to the batch's last first token, per iteration
    decode_tok_per_s: list[float]  # tokens after the first, over the time they took
    # Speculative decoding over the measured iterations (None when off).
    spec_decoding: SpecDecodingStats | None = None

    @property
    def avg_latency(self) -> float:
        return float(np.mean(self.latencies))

    def percentiles(self) -> dict[int, float]:
        return {p: float(np.percentile(self.latencies, p)) for p in LATENCY_PERCENTILES}

    def to_json(self) -> dict[str, Any]:
        """vLLM's keys (``avg_latency``, ``latencies``, ``percentiles``) plus Octavo's."""
        return {"batch_size": self.batch_size, "input_len": self.input_len,
                "output_len": self.output_len, "avg_latency": self.avg_latency,
                "latencies": self.latencies,
                "percentiles": {str(p): v for p, v in self.percentiles().items()},
                "avg_ttft": float(np.mean(self.ttfts)), "ttfts": self.ttfts,
                "avg_decode_tok_per_s": float(np.mean(self.decode_tok_per_s)),
                "decode_tok_per_s": self.decode_tok_per_s,
                "spec_decoding": spec_summary(self.spec_decoding)}


def run_latency(llm: LLM, requests: list[BenchRequest], num_iters_warmup: int,
                num_iters: int) -> LatencyResult:
    """Submit ``requests`` as one batch ``num_iters_warmup + num_iters`` times; time the last
    ``num_iters``."""
    if num_iters < 1 or num_iters_warmup < 0:
        raise ValueError(f"--num-iters must be at least 1 and --num-iters-warmup non-negative, "
                         f"got {num_iters} and {num_iters_warmup}")
    warm_up(llm)
    for _ in tqdm(range(num_iters_warmup), desc="Warm-up iterations", dynamic_ncols=True):
        generate(llm, requests, show_progress=False)
    result = LatencyResult(len(requests), requests[0].prompt_len, requests[0].output_len,
                           [], [], [])
    before = _spec_stats(llm)
    for _ in tqdm(range(num_iters), desc="Measured iterations", dynamic_ncols=True):
        start = time.perf_counter()
        outputs = generate(llm, requests, show_progress=False)
        result.latencies.append(time.perf_counter() - start)
        ttft, decode_rate = _batch_timings(outputs)
        result.ttfts.append(ttft)
        result.decode_tok_per_s.append(decode_rate)
    after = _spec_stats(llm)
    if before is not None and after is not None:
        result.spec_decoding = after.since(before)
    return result


def _spec_stats(llm: LLM) -> SpecDecodingStats | None:
    return llm.llm_engine.core.scheduler.make_stats().spec_decoding


def _batch_timings(outputs: list[Any]) -> tuple[float, float]:
    """From the engine's per-request timestamps: when the whole batch had its first token, and
    the decode rate from the first first token to the last last token."""
    metrics = [o.metrics for o in outputs]
    arrival = min(m.arrival_time for m in metrics)
    first = min(m.first_token_time for m in metrics)
    last = max(m.last_token_time for m in metrics)
    ttft = max(m.first_token_time for m in metrics) - arrival
    decoded = sum(len(o.outputs[0].token_ids) - 1 for o in outputs)
    return ttft, decoded / (last - first) if last > first else 0.0
