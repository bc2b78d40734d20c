"""The arrival process: Gamma gaps with the asked mean rate, and the coefficient of variation
1 / sqrt(burstiness) - 1 for Poisson arrivals, sqrt(2) for burstiness 0.5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from octavo.bench.arrival import RampUp, arrival_offsets, gamma_gaps
from octavo.testing.seeds import draw_seed

NUM = 200_000  # the relative standard error of the mean is then ~0.3% (CV 1.41: 0.3%)


@pytest.mark.parametrize("burstiness", [1.0, 0.5])
@pytest.mark.parametrize("rate", [4.0, 25.0])
def test_gamma_gaps_mean_rate_and_cv(rate: float, burstiness: float) -> None:
    seed = draw_seed()
    gaps = gamma_gaps(rate, burstiness, NUM, np.random.default_rng(seed))
    measured_rate = 1.0 / gaps.mean()
    cv = gaps.std() / gaps.mean()
    assert measured_rate == pytest.approx(rate, rel=0.02), f"seed={seed}"
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.03), f"seed={seed}"


def test_offsets_start_at_zero_and_follow_the_rate() -> None:
    seed = draw_seed()
    offsets = arrival_offsets(NUM, request_rate=10.0, burstiness=1.0, seed=seed)
    assert offsets[0] == 0.0
    assert np.all(np.diff(offsets) >= 0)
    # NUM requests at 10/s span about (NUM - 1) / 10 seconds.
    assert offsets[-1] == pytest.approx((NUM - 1) / 10.0, rel=0.02), f"seed={seed}"
    assert np.array_equal(offsets, arrival_offsets(NUM, 10.0, 1.0, seed)), "same seed, same times"


def test_infinite_rate_sends_everything_at_once() -> None:
    assert np.array_equal(arrival_offsets(5, math.inf), np.zeros(5))


def test_ramp_up_rates() -> None:
    linear = RampUp("linear", 1.0, 5.0).rates(5)
    assert linear == pytest.approx([1, 2, 3, 4, 5])
    exponential = RampUp("exponential", 1.0, 16.0).rates(5)
    assert exponential == pytest.approx([1, 2, 4, 8, 16])


def test_ramp_up_gaps_shrink_as_the_rate_grows() -> None:
    seed = draw_seed()
    ramp = RampUp("linear", 1.0, 100.0)
    gaps = np.diff(arrival_offsets(20_000, math.inf, 1.0, seed, ramp_up=ramp))
    first, last = gaps[:2000].mean(), gaps[-2000:].mean()
    # Mean gap over the first tenth: rates ~1..10.9; over the last: ~90..100.
    assert first > 5 * last, f"seed={seed}"


@pytest.mark.parametrize("kwargs, says", [
    ({"request_rate": 0.0}, "request-rate"),
    ({"request_rate": 1.0, "burstiness": 0.0}, "burstiness"),
])
def test_bad_arrival_settings_are_named(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        arrival_offsets(10, **kwargs)


def test_bad_ramp_up_is_named() -> None:
    with pytest.raises(ValueError, match="ramp-up-strategy"):
        RampUp("sudden", 1.0, 2.0)
    with pytest.raises(ValueError, match="ramp-up-start-rps"):
        RampUp("linear", 0.0, 2.0)
