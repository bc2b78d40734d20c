"""How ranks are numbered with tensor, sequence and pipeline parallelism together, and the
groups each kind of collective runs over (``RankInfo``): pure arithmetic, no processes."""

from __future__ import annotations

from octavo.distributed.state import RankInfo, output_rank


def test_tensor_ranks_of_a_sequence_shard_are_consecutive() -> None:
    # tp=2, sp=2, pp=2: rank = (pp_rank * sp + sp_rank) * tp + tp_rank
    infos = [RankInfo.of(rank, tp_size=2, pp_size=2, sp_size=2) for rank in range(8)]
    assert [(i.pp_rank, i.sp_rank, i.tp_rank) for i in infos] == [
        (p, s, t) for p in range(2) for s in range(2) for t in range(2)]
    assert [i.rank for i in infos] == list(range(8))
    info = infos[0]
    assert info.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert info.sp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert info.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [i.rank for i in infos if i.is_output_rank] == [output_rank(2, 2, 2)] == [4]


def test_without_sequence_parallelism_the_layout_is_vllms() -> None:
    infos = [RankInfo.of(rank, tp_size=3, pp_size=2) for rank in range(6)]
    assert [(i.pp_rank, i.tp_rank) for i in infos] == [(p, t) for p in range(2)
                                                       for t in range(3)]
    assert infos[0].tp_groups() == [[0, 1, 2], [3, 4, 5]]
    assert infos[0].pp_groups() == [[0, 3], [1, 4], [2, 5]]
    assert output_rank(3, 2) == 3
