"""KV-cache sizing from --gpu-memory-utilization: the arithmetic of the CUDA platform's
worker and the largest step its profiling run measures - no device needed."""

from __future__ import annotations

import pytest
import torch

from octavo.plugin_api import num_kv_blocks
from octavo_triton.memory_profile import (
    GIB,
    MemoryProfile,
    kv_cache_budget,
    profile_step,
)

H100 = MemoryProfile(total=80 * GIB, weights=16 * GIB, peak_activations=3 * GIB,
                     non_torch=GIB // 2)


def test_budget_is_the_share_left_after_weights_activations_and_others() -> None:
    assert kv_cache_budget(H100, 0.9) == int(80 * GIB * 0.9) - 16 * GIB - 3 * GIB - GIB // 2
    assert kv_cache_budget(H100, 1.0) == 80 * GIB - 19 * GIB - GIB // 2
    # A lower utilization leaves the rest of the device to other processes.
    assert kv_cache_budget(H100, 0.5) < kv_cache_budget(H100, 0.9)


def test_no_room_says_what_to_change() -> None:
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization") as info:
        kv_cache_budget(H100, 0.2)
    assert "weights 16.00 GiB" in str(info.value)
    assert "0.20 of the device is 16.00 GiB" in str(info.value)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        kv_cache_budget(H100, 1.5)


def test_whole_blocks_only() -> None:
    assert num_kv_blocks(10 * 1024 + 5, 1024) == 10
    with pytest.raises(ValueError, match="holds no block of 1024 bytes; raise --kv-cache-memory"):
        num_kv_blocks(1000, 1024)
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization"):
        num_kv_blocks(1000, 1024, flag="--gpu-memory-utilization")


@pytest.mark.parametrize(("batched", "seqs", "model_len", "lens"), [
    (8192, 256, 2048, [2048] * 4),  # the token budget in full-length prompts
    (8192, 256, 3000, [3000, 3000, 2192]),  # the last prompt takes the rest
    (8192, 2, 1000, [1000, 1000]),  # two sequences cannot use the whole budget
    (100, 256, 2048, [100]),
])
def test_profile_step_is_the_largest_step_the_scheduler_can_form(
        batched: int, seqs: int, model_len: int, lens: list[int]) -> None:
    step = profile_step(batched, seqs, model_len, block_size=16, device=torch.device("cpu"))
    meta = step.metadata
    assert meta.seq_lens.tolist() == lens
    assert meta.query_start_loc.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    assert meta.num_actual_tokens == step.input_ids.numel() == sum(lens)
    assert meta.num_reqs == len(lens) and meta.max_query_len == max(lens)
    # Whole prompts: each request's positions start at 0.
    starts = meta.query_start_loc.tolist()
    assert all(step.positions[s].item() == 0 for s in starts[:-1])
    # Every token goes to block 0, which every request reads: a one-block cache suffices.
    assert int(meta.slot_mapping.max()) < 16 and int(meta.block_tables.max()) == 0
    assert meta.block_tables.shape == (len(lens), -(-max(lens) // 16))
    assert step.num_sampled == seqs
