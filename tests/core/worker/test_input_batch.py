"""The persistent batch's rows are a function of the ``SchedulerOutput``s alone: every
tensor rank (and pipeline stage) keeps its own ``InputBatch``, flattens a step's tokens in
row order, and sums (or passes on) results token by token, so their rows must agree."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from octavo import SamplingParams
from octavo.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from octavo.worker.input_batch import CachedRequestState, InputBatch


class IteratedSet(set[str]):
    """A set iterated in a given order: what another process's hash salt may give."""

    def __init__(self, order: list[str]) -> None:
        super().__init__(order)
        self.order = order

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)


def state(new: NewRequestData) -> CachedRequestState:
    return CachedRequestState(req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids),
                              sampling_params=new.sampling_params, output_token_ids=[],
                              generator=None, block_ids=list(new.block_ids))


def step(new: Sequence[str] = (), finished: set[str] | None = None) -> SchedulerOutput:
    """Requests named ``new`` arrive (request ``i`` of them with prompt ``[i]`` in block
    ``i``), those in ``finished`` leave."""
    arriving = [NewRequestData(req_id=r, prompt_token_ids=[i], sampling_params=SamplingParams(),
                               block_ids=[i], num_computed_tokens=0) for i, r in enumerate(new)]
    return SchedulerOutput(arriving, CachedRequestData(), {r: 1 for r in new}, len(new),
                           finished_req_ids=finished or set())


def batch_after(finished: set[str]) -> InputBatch:
    batch = InputBatch(max_num_reqs=8, max_model_len=16, max_blocks_per_req=1)
    batch.apply(step(["a", "b", "c", "d", "e", "f"]), state)
    batch.apply(step(finished=finished), state)
    return batch


def test_finished_requests_leave_the_same_rows_in_any_set_order() -> None:
    # a, then b (sorted): f fills a's row 0, then e b's row 1. b, then a would leave e, f.
    one, other = batch_after(IteratedSet(["a", "b"])), batch_after(IteratedSet(["b", "a"]))
    assert one.req_ids == other.req_ids == ["f", "e", "c", "d"]
    rows = slice(0, one.num_reqs)
    assert np.array_equal(one.token_ids[rows, 0], other.token_ids[rows, 0])
    assert np.array_equal(one.block_table[rows, 0], other.block_table[rows, 0])
