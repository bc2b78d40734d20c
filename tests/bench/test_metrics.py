"""The serving metric arithmetic on hand-written timestamps: every expected value below is
worked out from the definitions (vLLM's), not taken from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.bench.metrics import (
    RequestRecord,
    compute_metrics,
    describe,
    parse_percentiles,
    parse_slos,
    peak_concurrency,
)
from octavo.testing.seeds import draw_seed


def record(start: float, chunk_times: list[float], end: float, output_len: int,
           prompt_len: int = 10) -> RequestRecord:
    """A request sent at ``start`` whose chunks arrived at the absolute ``chunk_times`` and
    whose stream closed at ``end``."""
    return RequestRecord(prompt_len=prompt_len, start=start, ttft=chunk_times[0] - start,
                         itl=list(np.diff(chunk_times)), latency=end - start,
                         output_len=output_len, success=True)


# A: sent at 0, chunks at 0.5, 0.7, 1.0, 1.5, closed at 1.5: 4 tokens.
#    TTFT 0.5, ITLs 0.2 0.3 0.5, E2E 1.5, TPOT (1.5 - 0.5) / 3 = 1/3.
# B: sent at 1.0, chunks at 1.2, 1.3, closed at 1.4: 2 tokens.
#    TTFT 0.2, ITL 0.1, E2E 0.4, TPOT (0.4 - 0.2) / 1 = 0.2.
# C: sent at 2.0, one chunk at 3.0, closed at 3.0: 1 token. TTFT 1, E2E 1, no TPOT, no ITL.
# D: failed.
A = record(0.0, [0.5, 0.7, 1.0, 1.5], 1.5, 4)
B = record(1.0, [1.2, 1.3], 1.4, 2, prompt_len=20)
C = record(2.0, [3.0], 3.0, 1, prompt_len=30)
D = RequestRecord(prompt_len=40, start=2.5, error="HTTP 500: boom")


def test_per_request_timings() -> None:
    assert A.ttft == pytest.approx(0.5)
    assert A.itl == pytest.approx([0.2, 0.3, 0.5])
    assert A.tpot == pytest.approx(1 / 3)
    assert B.tpot == pytest.approx(0.2)
    assert C.tpot == 0.0
    assert A.token_times() == pytest.approx([0.5, 0.7, 1.0, 1.5])


def test_run_aggregates() -> None:
    m = compute_metrics([A, B, C, D], duration_s=4.0, percentiles=(50.0, 99.0))
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (60, 7)
    assert m.request_throughput == pytest.approx(3 / 4)
    assert m.output_throughput == pytest.approx(7 / 4)
    assert m.total_token_throughput == pytest.approx(67 / 4)
    assert m.goodput is None  # no SLO given
    # TTFT 500, 200, 1000 ms: mean 566.67, median 500, p99 between 500 and 1000.
    assert m.ttft_ms.mean == pytest.approx(1700 / 3)
    assert m.ttft_ms.median == pytest.approx(500)
    assert m.ttft_ms.percentiles[99.0] == pytest.approx(500 + 0.98 * 500)
    # TPOT over requests with 2+ tokens only: 333.33 and 200 ms.
    assert m.tpot_ms.mean == pytest.approx((1000 / 3 + 200) / 2)
    # ITL pools every gap: 200, 300, 500, 100 ms.
    assert m.itl_ms.mean == pytest.approx(275)
    assert m.itl_ms.median == pytest.approx(250)
    # E2E 1500, 400, 1000 ms.
    assert m.e2el_ms.median == pytest.approx(1000)
    assert m.e2el_ms.std == pytest.approx(np.std([1500, 400, 1000]))
    # A (0-1.5) and B (1.0-1.4) overlap; C (2-3) is alone.
    assert m.peak_concurrency == 2


def test_goodput_counts_requests_meeting_every_slo() -> None:
    # ttft <= 600 ms keeps A, B (C has 1000 ms); tpot <= 250 ms then drops A (333 ms).
    assert compute_metrics([A, B, C], 2.0, slos_ms={"ttft": 600}).goodput == pytest.approx(1.0)
    assert compute_metrics([A, B, C], 2.0,
                           slos_ms={"ttft": 600, "tpot": 250}).goodput == pytest.approx(0.5)
    # e2el <= 1000 ms keeps B and C (exactly at the limit counts as met).
    assert compute_metrics([A, B, C], 2.0, slos_ms={"e2el": 1000}).goodput == pytest.approx(1.0)


def test_peak_concurrency_touching_intervals_do_not_overlap() -> None:
    first = record(0.0, [0.5], 1.0, 1)
    second = record(1.0, [1.5], 2.0, 1)
    assert peak_concurrency([first, second]) == 1
    assert peak_concurrency([first, second, record(0.5, [0.6], 1.5, 1)]) == 2
    assert peak_concurrency([]) == 0


def test_describe_matches_numpy_on_random_data() -> None:
    seed = draw_seed()
    values = np.random.default_rng(seed).exponential(0.1, size=257)
    d = describe(values.tolist(), (10.0, 90.0), scale=1000.0)
    assert d.mean == pytest.approx(values.mean() * 1000), f"seed={seed}"
    assert d.percentiles[90.0] == pytest.approx(np.percentile(values, 90) * 1000), f"seed={seed}"
    empty = describe([], (50.0,))
    assert (empty.mean, empty.percentiles) == (0.0, {50.0: 0.0})


def test_all_failed_run_still_reports() -> None:
    m = compute_metrics([D], 1.0, slos_ms={"ttft": 100})
    assert (m.completed, m.failed, m.goodput, m.ttft_ms.mean) == (0, 1, 0.0, 0.0)


def test_parse_slos_and_percentiles() -> None:
    assert parse_slos(["ttft:200", "tpot:50.5", "e2el:3000"]) == {
        "ttft": 200.0, "tpot": 50.5, "e2el": 3000.0}
    for bad, says in [("itl:5", "NAME:MS"), ("ttft", "NAME:MS"), ("ttft:fast", "not a number"),
                      ("ttft:0", "positive")]:
        with pytest.raises(ValueError, match=says):
            parse_slos([bad])
    assert parse_percentiles("50,90,99.9") == (50.0, 90.0, 99.9)
    with pytest.raises(ValueError, match="metric-percentiles"):
        parse_percentiles("50,101")
    with pytest.raises(ValueError, match="metric-percentiles"):
        parse_percentiles("p50")


def test_duration_must_be_positive() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        compute_metrics([A], 0.0)
