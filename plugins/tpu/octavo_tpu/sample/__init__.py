"""The TPU backend's sampler in JAX: ``SamplingTensors`` (one step's settings as fixed-shape
arrays, built from ``SamplingParams`` in numpy) and ``sample`` (jit-compatible, one compile
per padded request count)."""

from octavo_tpu.sample.sampler import (
    SampleOutput,
    TopLogprobs,
    process_logits,
    sample,
    sample_jit,
    top_logprobs,
)
from octavo_tpu.sample.tensors import Penalties, SamplingTensors

__all__ = ["Penalties", "SampleOutput", "SamplingTensors", "TopLogprobs", "process_logits",
           "sample", "sample_jit", "top_logprobs"]
