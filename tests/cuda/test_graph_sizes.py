"""Which decode batch sizes get a CUDA graph, and which graph a batch is padded to -
device-free arithmetic of the CUDA platform's runner (``octavo_triton.cuda_graphs``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from octavo_triton.cuda_graphs import LARGEST_CAPTURED_BATCH, capture_sizes, padded_size


def test_capture_sizes_are_small_powers_then_multiples_of_eight() -> None:
    assert capture_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]  # max_num_seqs itself is captured
    assert capture_sizes(4096)[-1] == LARGEST_CAPTURED_BATCH


@given(max_num_seqs=st.integers(1, 2000), num_reqs=st.integers(1, 2000))
def test_a_batch_pads_to_the_smallest_captured_size_that_holds_it(max_num_seqs: int,
                                                                   num_reqs: int) -> None:
    sizes = capture_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes))
    size = padded_size(num_reqs, sizes)
    if num_reqs > sizes[-1]:
        assert size is None  # runs eagerly
        return
    assert size in sizes and size >= num_reqs
    assert all(s < num_reqs for s in sizes if s < size)
    if num_reqs <= min(max_num_seqs, LARGEST_CAPTURED_BATCH):
        assert size is not None  # every batch the scheduler can form up to the cap


def test_padding_examples() -> None:
    sizes = capture_sizes(64)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 4, 5, 8, 9, 63, 64, 65)] == [
        1, 2, 4, 4, 8, 8, 16, 64, 64, None]
