"""``OCTAVO_CPU_OMP_THREADS_BIND``: which cores each CPU worker process is pinned to."""

from __future__ import annotations

import pytest

from octavo.cpu.threads import parse_cpu_list, worker_cores


def test_core_lists_parse() -> None:
    assert parse_cpu_list("0-2,5") == [0, 1, 2, 5]
    assert parse_cpu_list(" 7 ") == [7]
    for bad in ("a", "3-1", "-1", "1-"):
        with pytest.raises(ValueError, match="OCTAVO_CPU_OMP_THREADS_BIND"):
            parse_cpu_list(bad)


@pytest.mark.parametrize(("spec", "world", "expected"), [
    (None, 2, [[0, 1], [2, 3]]),  # auto: an even share each, in order
    ("auto", 4, [[0], [1], [2], [3]]),
    (None, 3, [[0], [1], [2]]),  # 4 cores for 3 ranks: one each, the last core spare
    ("0|1", 2, [[0], [1]]),
    ("0-1|2-3", 2, [[0, 1], [2, 3]]),
    ("0,2|1,3", 2, [[0, 2], [1, 3]]),
    ("nobind", 2, [None, None]),
])
def test_worker_cores(spec: str | None, world: int, expected: list) -> None:
    assert [worker_cores(r, world, spec, [0, 1, 2, 3]) for r in range(world)] == expected


def test_more_ranks_than_cores_share_them_round_robin() -> None:
    assert [worker_cores(r, 4, None, [4, 5]) for r in range(4)] == [[4], [5], [4], [5]]


def test_a_list_per_rank_is_required() -> None:
    with pytest.raises(ValueError, match="names 1 core lists for 2 workers"):
        worker_cores(0, 2, "0-3", [0, 1, 2, 3])
