"""Sizing the KV cache of a GPU from ``--gpu-memory-utilization``.

The engine may use ``utilization`` of the device's memory. After the weights are loaded,
one forward pass of the largest step the scheduler can form (a *profiling run*) shows how
much memory activations need at their peak; memory used outside torch's allocator (the
CUDA context, other processes) is read from the driver. What is left of the engine's
share is the KV cache:

    kv_cache = total * utilization - weights - peak activations - non-torch memory

The arithmetic (:func:`kv_cache_budget`, :func:`profile_step`) needs no device and is
unit-tested; :func:`measure_memory` reads the device around a profiling run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.plugin_api import AttentionMetadata

GIB = 2**30


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes of device memory, as measured around a profiling run."""

    total: int  # the device's memory
    weights: int  # what torch held before the run: the weights and resident buffers
    peak_activations: int  # torch's peak during the run, above ``weights``
    non_torch: int  # used on the device but not by torch's allocator

    def describe(self) -> str:
        return (f"device {self.total / GIB:.2f} GiB, weights {self.weights / GIB:.2f} GiB, "
                f"peak activations {self.peak_activations / GIB:.2f} GiB, "
                f"non-torch {self.non_torch / GIB:.2f} GiB")


def kv_cache_budget(profile: MemoryProfile, utilization: float) -> int:
    """Bytes for the KV cache; raises ``ValueError`` saying what to change when nothing is
    left."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    share = int(profile.total * utilization)
    budget = share - profile.weights - profile.peak_activations - profile.non_torch
    if budget <= 0:
        raise ValueError(
            f"no memory left for the KV cache: {utilization:.2f} of the device is "
            f"{share / GIB:.2f} GiB, and {profile.describe()}; raise "
            "--gpu-memory-utilization, or lower --max-num-batched-tokens / --max-num-seqs")
    return budget


@dataclass
class ProfileStep:
    """Inputs of the largest step the scheduler can form, for the profiling run."""

    input_ids: torch.Tensor  # int64 [T], zeros
    positions: torch.Tensor  # int64 [T]
    metadata: AttentionMetadata
    num_sampled: int  # rows of logits a step can sample (max_num_seqs)


def profile_step(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device) -> ProfileStep:
    """Prompts of ``max_model_len`` tokens (the last one shorter) filling the step's token
    budget - as many tokens as a step can hold. Every token is written into the first
    block of the cache and every request reads that block, so the run needs a KV cache of
    one block per layer (its values do not matter)."""
    num_tokens = min(max_num_batched_tokens, max_num_seqs * max_model_len)
    full, rest = divmod(num_tokens, max_model_len)
    lens = [max_model_len] * full + ([rest] if rest else [])
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    query_start_loc = torch.zeros(len(lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = seq_lens.cumsum(0)
    positions = torch.cat([torch.arange(n) for n in lens])
    max_blocks = -(-max(lens) // block_size)
    metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        num_reqs=len(lens),
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens.to(device),
        block_tables=torch.zeros(len(lens), max_blocks, dtype=torch.int32, device=device),
        slot_mapping=(positions % block_size).to(device),
        max_query_len=max(lens),
        max_seq_len=max(lens),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    return ProfileStep(torch.zeros(num_tokens, dtype=torch.int64, device=device),
                       positions.to(device), metadata, max_num_seqs)


def measure_memory(run: Callable[[], None]) -> MemoryProfile:
    """Run ``run`` (the profiling run) on the current CUDA/HIP device and measure."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - weights
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    non_torch = max(0, total - free - torch.cuda.memory_reserved())
    return MemoryProfile(total=total, weights=weights, peak_activations=peak,
                         non_torch=non_torch)
