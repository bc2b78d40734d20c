"""When requests arrive: gaps drawn from a Gamma distribution, as in vLLM's serving benchmark.

A Gamma distribution with shape ``k = burstiness`` and scale ``1 / (rate * k)`` has mean
``1 / rate`` whatever ``k`` is, and coefficient of variation ``1 / sqrt(k)``: ``k = 1`` is
the exponential (a Poisson process), ``k < 1`` bunches requests into bursts, ``k > 1``
spaces them evenly. An infinite rate sends everything at once.

A ramp-up moves the rate from a start to an end value over the run (linearly or
geometrically) - a load test that finds where latency starts to climb in one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RAMP_UP_STRATEGIES = ("linear", "exponential")


@dataclass
class RampUp:
    strategy: str  # one of RAMP_UP_STRATEGIES
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if self.strategy not in RAMP_UP_STRATEGIES:
            raise ValueError(f"--ramp-up-strategy must be one of {', '.join(RAMP_UP_STRATEGIES)}"
                             f", got {self.strategy!r}")
        if not (0 < self.start_rps < math.inf and 0 < self.end_rps < math.inf):
            raise ValueError("--ramp-up-start-rps and --ramp-up-end-rps must be positive and "
                             f"finite, got {self.start_rps} and {self.end_rps}")

    def rates(self, num: int) -> np.ndarray:
        """The request rate in force when each of ``num`` requests is sent."""
        progress = np.arange(num) / max(num - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress


def gamma_gaps(rates: np.ndarray | float, burstiness: float, num: int,
               rng: np.random.Generator) -> np.ndarray:
    """``num`` gaps in seconds, each Gamma-distributed with mean ``1 / rate``."""
    if burstiness <= 0:
        raise ValueError(f"--burstiness must be positive, got {burstiness}")
    rates = np.broadcast_to(np.asarray(rates, dtype=np.float64), (num,))
    if np.any(rates <= 0):
        raise ValueError(f"--request-rate must be positive, got {rates.min()}")
    gaps = np.zeros(num)
    finite = np.isfinite(rates)
    gaps[finite] = rng.gamma(burstiness, 1.0 / (rates[finite] * burstiness))
    return gaps


def arrival_offsets(num: int, request_rate: float, burstiness: float = 1.0,
                    seed: int = 0, ramp_up: RampUp | None = None) -> np.ndarray:
    """Send times of ``num`` requests in seconds from the start: the first at 0, each next one
    a Gamma gap after the previous. ``ramp_up`` replaces ``request_rate`` when given."""
    rates = ramp_up.rates(num) if ramp_up is not None else request_rate
    gaps = gamma_gaps(rates, burstiness, num, np.random.default_rng(seed))
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if num else np.zeros(0)
