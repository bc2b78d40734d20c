"""The shapes a Neuron device would compile the model for, as vllm-neuron does.

The Neuron compiler builds one graph per input shape, ahead of time, so a device worker
pads every step up to the nearest of a few buckets: context-encoding (prefill) buckets of
token counts and token-generation (decode) buckets of batch sizes. This module computes
them from the engine config; in emulation nothing is compiled, and the worker only logs
them, so the shapes a device would need are visible and tested before a device path exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.plugin_api import EngineConfig

FIRST_PREFILL_BUCKET = 128  # tokens: the partition count, the row tile of every kernel


def power_of_two_buckets(first: int, last: int) -> list[int]:
    """``first, 2 * first, 4 * first, ...`` below ``last``, then ``last`` itself (the
    largest shape must fit the largest step); ``[last]`` when ``last <= first``."""
    buckets = []
    size = first
    while size < last:
        buckets.append(size)
        size *= 2
    return [*buckets, last]


@dataclass(frozen=True)
class Buckets:
    prefill_tokens: list[int]  # context-encoding buckets: tokens of a step
    decode_batches: list[int]  # token-generation buckets: requests of a decode step

    @classmethod
    def from_config(cls, config: EngineConfig) -> Buckets:
        scheduler = config.scheduler
        return cls(power_of_two_buckets(FIRST_PREFILL_BUCKET, scheduler.max_num_batched_tokens),
                   power_of_two_buckets(1, scheduler.max_num_seqs))

    def describe(self) -> str:
        return (f"neuron: would compile {len(self.prefill_tokens)} context-encoding buckets "
                f"{self.prefill_tokens} and {len(self.decode_batches)} token-generation "
                f"buckets {self.decode_batches} on a device")
