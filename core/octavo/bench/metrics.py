"""Serving metrics from what a client observed: per-request timestamps in, TTFT / TPOT / ITL /
E2E latency distributions, throughput, peak concurrency and goodput out. Definitions are
vLLM's, so numbers compare across engines:

- TTFT: from sending the request to its first streamed token;
- ITL: the gaps between successive streamed chunks of one request;
- TPOT: ``(e2e - ttft) / (output_len - 1)``, the mean time per token after the first;
- E2E: from sending to the last byte;
- goodput: requests per second that met every given SLO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds; ``start`` counts from the start
    of the benchmark, the others from ``start``."""

    prompt_len: int
    start: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_len: int = 0
    success: bool = False
    error: str = ""

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; 0 for a one-token reply (no gap)."""
        if self.output_len < 2:
            return 0.0
        return (self.latency - self.ttft) / (self.output_len - 1)

    def token_times(self) -> list[float]:
        """When each streamed chunk arrived, in benchmark time."""
        first = self.start + self.ttft
        return [first] + (first + np.cumsum(self.itl)).tolist()


@dataclass
class Distribution:
    """Summary of one latency, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]


@dataclass
class ServeMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None  # None when no SLO was given
    peak_concurrency: int
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution


def describe(values: list[float], percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
             scale: float = 1.0) -> Distribution:
    """Mean, median, standard deviation and percentiles (numpy's linear interpolation) of
    ``values * scale``; all zero for no values, so an all-failed run still reports."""
    data = np.asarray(values, dtype=np.float64) * scale
    if data.size == 0:
        return Distribution(0.0, 0.0, 0.0, {p: 0.0 for p in percentiles})
    return Distribution(float(data.mean()), float(np.median(data)), float(data.std()),
                        {p: float(np.percentile(data, p)) for p in percentiles})


def concurrency_steps(records: list[RequestRecord]) -> list[tuple[float, int]]:
    """(time, requests in flight from then on) at every send and every end, in time order.
    A request that ends exactly when another starts does not overlap it."""
    events = sorted([(r.start, 1) for r in records] + [(r.start + r.latency, -1) for r in records])
    steps, current = [], 0
    for time, change in events:  # at equal times -1 sorts first: ends before starts
        current += change
        steps.append((time, current))
    return steps


def peak_concurrency(records: list[RequestRecord]) -> int:
    """The most requests in flight at once."""
    return max((count for _, count in concurrency_steps(records)), default=0)


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    observed = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.latency}
    return all(observed[name] * 1000.0 <= limit for name, limit in slos_ms.items())


def compute_metrics(records: list[RequestRecord], duration_s: float,
                    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                    slos_ms: dict[str, float] | None = None) -> ServeMetrics:
    """Aggregate a run. Failed requests count only in ``failed``; throughputs are over the
    whole ``duration_s`` (first send to last reply)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    done = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    goodput = None
    if slos_ms:
        goodput = sum(meets_slos(r, slos_ms) for r in done) / duration_s
    return ServeMetrics(
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(done) / duration_s,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        goodput=goodput,
        peak_concurrency=peak_concurrency(done),
        ttft_ms=describe([r.ttft for r in done], percentiles, 1000.0),
        tpot_ms=describe([r.tpot for r in done if r.output_len > 1], percentiles, 1000.0),
        itl_ms=describe([gap for r in done for gap in r.itl], percentiles, 1000.0),
        e2el_ms=describe([r.latency for r in done], percentiles, 1000.0),
    )


def parse_slos(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (``--goodput``) -> ``{"ttft": 200.0, "tpot": 50.0}`` in ms."""
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_NAMES:
            raise ValueError(f"--goodput {item!r}: expected NAME:MS with NAME one of "
                             f"{', '.join(SLO_NAMES)}")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
        if limit <= 0:
            raise ValueError(f"--goodput {item!r}: the limit must be positive")
        slos[name] = limit
    return slos


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` (``--metric-percentiles``) -> ``(50.0, 90.0, 99.0)``."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"--metric-percentiles {text!r}: expected numbers like 50,90,99") from None
    if not all(0 < p <= 100 for p in values):
        raise ValueError(f"--metric-percentiles {text!r}: each must be in (0, 100]")
    return values
