"""``octavo bench autotune``: which ``max_num_seqs`` x ``max_num_batched_tokens`` serves the most
load within a latency limit. Each grid point gets a fresh ``octavo serve``; request rates are
tried from low to high and the search stops at the first rate whose p99 end-to-end latency
exceeds the limit (latency only grows with load, so higher rates would fail too)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo.bench.datasets import BenchRequest
from octavo.bench.metrics import ServeMetrics, compute_metrics
from octavo.bench.serve import ServeTarget, fetch_model_name, run_serve
from octavo.bench.server import ServerProcess

P99 = 99.0


@dataclass
class RateTrial:
    request_rate: float
    p99_e2el_ms: float
    failed: int
    request_throughput: float
    output_throughput: float

    def meets(self, max_latency_ms: float) -> bool:
        return self.failed == 0 and self.p99_e2el_ms <= max_latency_ms


@dataclass
class GridPoint:
    max_num_seqs: int
    max_num_batched_tokens: int
    trials: list[RateTrial] = field(default_factory=list)
    best: RateTrial | None = None  # the highest rate that met the limit


@dataclass
class TuneSettings:
    max_latency_ms: float
    request_rates: list[float]
    burstiness: float = 1.0
    seed: int = 0
    serve_args: list[str] = field(default_factory=list)  # other `octavo serve` flags


def trial_of(rate: float, metrics: ServeMetrics) -> RateTrial:
    return RateTrial(rate, metrics.e2el_ms.percentiles[P99], metrics.failed,
                     metrics.request_throughput, metrics.output_throughput)


def tune_point(base_url: str, requests: list[BenchRequest], settings: TuneSettings,
               point: GridPoint) -> None:
    """Raise the rate until the limit breaks; record every trial and the best one."""
    target = ServeTarget(base_url, asyncio.run(fetch_model_name(base_url)))
    for rate in sorted(settings.request_rates):
        run = run_serve(target, requests, rate, settings.burstiness, seed=settings.seed)
        trial = trial_of(rate, compute_metrics(run.records, run.duration_s, (P99,)))
        point.trials.append(trial)
        if not trial.meets(settings.max_latency_ms):
            break
        point.best = trial


def autotune(seqs_grid: list[int], tokens_grid: list[int], requests: list[BenchRequest],
             settings: TuneSettings,
             on_point: Callable[[GridPoint], None] = lambda point: None) -> list[GridPoint]:
    """Every grid point, each on its own server; ``on_point`` sees each as it finishes."""
    points = []
    for seqs in seqs_grid:
        for tokens in tokens_grid:
            point = GridPoint(seqs, tokens)
            args = [*settings.serve_args, "--max-num-seqs", str(seqs),
                    "--max-num-batched-tokens", str(tokens)]
            with ServerProcess(args) as server:
                tune_point(server.base_url, requests, settings, point)
            on_point(point)
            points.append(point)
    return points


def best_point(points: list[GridPoint]) -> GridPoint | None:
    """The point that met the limit at the highest rate; output throughput breaks ties (an
    infinite rate ties often: every setting that copes with a burst)."""
    passing = [(p.best.request_rate, p.best.output_throughput, i)
               for i, p in enumerate(points) if p.best is not None]
    return points[max(passing)[2]] if passing else None


def to_json(points: list[GridPoint], best: GridPoint | None,
            settings: TuneSettings) -> dict[str, Any]:
    return {"max_latency_ms": settings.max_latency_ms, "request_rates": settings.request_rates,
            "serve_args": settings.serve_args, "grid": [asdict(p) for p in points],
            "best": asdict(best) if best is not None else None}


def parse_rates(text: str) -> list[float]:
    """``"1,2,4,inf"`` (``--request-rates``) -> ``[1.0, 2.0, 4.0, inf]``."""
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise ValueError(f"--request-rates {text!r}: expected numbers like 1,2,4,inf") from None
    if not rates or any(r <= 0 or math.isnan(r) for r in rates):
        raise ValueError(f"--request-rates {text!r}: each rate must be positive")
    return rates


def seqs_grid_around(b_sat: float) -> list[int]:
    """``max_num_seqs`` values around the saturation batch size: past ``B_sat`` a step grows
    with the batch and the throughput no longer does, so the best setting is near it. Powers
    of two from half to twice it (a memory-bound model, ``inf``: large batches)."""
    if not math.isfinite(b_sat):
        return [64, 256, 1024]
    centre = max(1, 2 ** round(math.log2(max(b_sat, 1.0))))
    return sorted({max(1, centre // 2), centre, centre * 2})
