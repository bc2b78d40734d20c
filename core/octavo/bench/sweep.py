"""``octavo bench sweep``: decode step time at growing batch sizes, beside the roofline.

At each batch size B (1, 2, 4, ... up to ``--max-batch-size``) a batch of B random prompts
of ``--context-len`` tokens is prefilled and then decoded for ``--steps`` steps, repeated:
offline (``bench latency``'s loop) the step time is the time from the batch's last first
token to its last token, over the steps; against a server (``--base-url``: any
OpenAI-compatible one, so vLLM can be swept by the same tool) B streams are held at once
and the step time is their median time per output token (TPOT). Medians over the
iterations. Next to each point stand the
bytes and FLOPs the step must move and do (``roofline``), what they achieve, and the step
time the machine's measured peaks (``calibrate``) allow.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tqdm.auto import tqdm

from octavo.bench.datasets import BenchRequest, random_requests
from octavo.bench.latency import run_latency
from octavo.bench.roofline import (
    ModelShape,
    Peaks,
    Prediction,
    StepCost,
    decode_step_cost,
    predict,
    saturation_batch,
)
from octavo.bench.serve import EndpointError, ServeTarget, run_serve
from octavo.engine.llm import LLM

FLOOR_FACTOR = 1.5  # the observed knee: the first B whose step takes this x B=1's


@dataclass
class SweepPoint:
    batch_size: int
    step_s: float  # measured, median
    cost: StepCost
    predicted: Prediction

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size / self.step_s

    @property
    def bytes_per_s(self) -> float:
        return self.cost.bytes / self.step_s

    @property
    def flops_per_s(self) -> float:
        return self.cost.flops / self.step_s

    @property
    def over_bound(self) -> float:
        """Measured / predicted: 1.0 would be the machine's ceiling."""
        return self.step_s / self.predicted.step_s


@dataclass
class SweepResult:
    shape: ModelShape
    peaks: Peaks
    context_len: int
    steps: int
    b_sat_predicted: float
    points: list[SweepPoint]
    label: str = "octavo"  # the engine swept, for the plot's legend
    weight_bytes: float = 2  # bytes per weight the roofline streams (bf16: 2)

    @property
    def b_sat_observed(self) -> int | None:
        """The first batch size whose step takes ``FLOOR_FACTOR`` x the B=1 step, or None."""
        floor = self.points[0].step_s
        return next((p.batch_size for p in self.points if p.step_s >= FLOOR_FACTOR * floor),
                    None)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "shape": asdict(self.shape), "peaks": asdict(self.peaks),
                "context_len": self.context_len, "steps": self.steps,
                "weight_bytes": self.weight_bytes,
                "b_sat_predicted": self.b_sat_predicted, "b_sat_observed": self.b_sat_observed,
                "points": [{"batch_size": p.batch_size, "step_s": p.step_s,
                            "tokens_per_s": p.tokens_per_s, "bytes": p.cost.bytes,
                            "flops": p.cost.flops, "bytes_per_s": p.bytes_per_s,
                            "flops_per_s": p.flops_per_s,
                            "predicted_step_s": p.predicted.step_s,
                            "predicted_memory_s": p.predicted.memory_s,
                            "predicted_compute_s": p.predicted.compute_s,
                            "bound": p.predicted.bound, "over_bound": p.over_bound}
                           for p in self.points]}


def batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... and ``max_batch_size`` itself."""
    if max_batch_size < 1:
        raise ValueError(f"--max-batch-size must be at least 1, got {max_batch_size}")
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    return sizes if sizes[-1] == max_batch_size else [*sizes, max_batch_size]


def run_sweep(llm: LLM, shape: ModelShape, peaks: Peaks, sizes: list[int], context_len: int,
              steps: int, num_iters_warmup: int, num_iters: int, seed: int,
              weight_bytes: float = 2, kv_bytes: int = 2) -> SweepResult:
    """The offline sweep, on ``llm`` in this process."""
    vocab = len(llm.get_tokenizer())

    def step_time(size: int) -> float:
        requests = _requests(size, context_len, steps, seed, vocab)
        result = run_latency(llm, requests, num_iters_warmup, num_iters)
        return statistics.median((latency - ttft) / steps for latency, ttft
                                 in zip(result.latencies, result.ttfts))

    return _sweep(step_time, shape, peaks, sizes, context_len, steps, weight_bytes, kv_bytes)


def run_server_sweep(target: ServeTarget, shape: ModelShape, peaks: Peaks, sizes: list[int],
                     context_len: int, steps: int, num_iters: int, seed: int, vocab: int,
                     weight_bytes: float = 2, kv_bytes: int = 2) -> SweepResult:
    """The sweep against a server: B streams at once, their median TPOT."""
    def step_time(size: int) -> float:
        medians = []
        for iteration in range(num_iters):
            requests = _requests(size, context_len, steps, seed + iteration, vocab)
            run = run_serve(target, requests, max_concurrency=size, show_progress=False)
            failed = [r.error for r in run.records if not r.success]
            if failed:
                raise EndpointError(f"{len(failed)} of {size} requests failed: {failed[0]}")
            medians.append(statistics.median(r.tpot for r in run.records))
        return statistics.median(medians)

    result = _sweep(step_time, shape, peaks, sizes, context_len, steps, weight_bytes,
                    kv_bytes)
    result.label = target.base_url
    return result


def _requests(size: int, context_len: int, steps: int, seed: int,
              vocab: int) -> list[BenchRequest]:
    return random_requests(size, context_len, steps + 1, seed=seed, vocab_size=vocab)


def _sweep(step_time: Callable[[int], float], shape: ModelShape, peaks: Peaks,
           sizes: list[int], context_len: int, steps: int, weight_bytes: float,
           kv_bytes: int) -> SweepResult:
    if steps < 1 or context_len < 1:
        raise ValueError(f"--steps and --context-len must be at least 1, got {steps} and "
                         f"{context_len}")
    mid_context = context_len + steps // 2  # the context grows by one token a step
    points = []
    for size in tqdm(sizes, desc="Batch sizes", dynamic_ncols=True):
        cost = decode_step_cost(shape, size, mid_context, weight_bytes, kv_bytes)
        points.append(SweepPoint(size, step_time(size), cost, predict(cost, peaks)))
    b_sat = saturation_batch(shape, peaks, mid_context, weight_bytes, kv_bytes)
    return SweepResult(shape, peaks, context_len, steps, b_sat, points,
                       weight_bytes=weight_bytes)
