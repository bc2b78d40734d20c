"""Sampling: ``SamplingParams``, the batched sampler and its logits processors."""

from octavo.sample.params import SamplingParams, SamplingType

__all__ = ["SamplingParams", "SamplingType"]
