"""The compile buckets a Neuron device would need, from the engine config."""

from __future__ import annotations

import pytest

from octavo.plugin_api import EngineConfig
from octavo_neuron.buckets import Buckets, power_of_two_buckets


@pytest.mark.parametrize(("first", "last", "want"), [
    (128, 8192, [128, 256, 512, 1024, 2048, 4096, 8192]),
    (128, 300, [128, 256, 300]),  # the last bucket is the limit itself, not a power of two
    (128, 128, [128]),
    (128, 32, [32]),  # a budget below the first bucket is the only bucket
    (1, 256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
    (1, 6, [1, 2, 4, 6]),
    (1, 1, [1]),
])
def test_power_of_two_buckets(first: int, last: int, want: list[int]) -> None:
    assert power_of_two_buckets(first, last) == want


def test_from_engine_config() -> None:
    config = EngineConfig.from_kwargs(model="unused", max_num_batched_tokens=1000,
                                      max_num_seqs=12)
    buckets = Buckets.from_config(config)
    assert buckets.prefill_tokens == [128, 256, 512, 1000]
    assert buckets.decode_batches == [1, 2, 4, 8, 12]
    assert buckets.describe() == (
        "neuron: would compile 4 context-encoding buckets [128, 256, 512, 1000] and 5 "
        "token-generation buckets [1, 2, 4, 8, 12] on a device")
