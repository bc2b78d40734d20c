"""CUDA graphs for decode steps: capture the model's forward pass once per batch size,
then replay it, so a decode step costs one graph launch instead of hundreds of kernel
launches from Python.

A graph replays fixed kernels on fixed memory, so:

- its inputs live in static buffers (:class:`StaticDecodeInputs`) that each step is copied
  into before the replay;
- only some batch sizes are captured (:func:`capture_sizes`) and a step is padded to the
  next captured size (:func:`padded_size`). Padding rows are requests with no context
  (``seq_len`` 0), one query token each and slot -1: the Triton kernels skip their cache
  write and give them zeros, so they change nothing;
- the attention metadata of a captured step says ``max_seq_len = max_model_len``, so the
  attention kernel's choices (split-KV or not) hold for any sequence length replayed later;
  the lengths themselves are read on the device.

HIP builds of torch run the same graphs on AMD GPUs (``torch.cuda.CUDAGraph``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from octavo.plugin_api import AttentionMetadata, CausalLM, StepInputs

LARGEST_CAPTURED_BATCH = 512


def capture_sizes(max_num_seqs: int, largest: int = LARGEST_CAPTURED_BATCH) -> list[int]:
    """Batch sizes to capture, ascending: 1, 2, 4, then every multiple of 8, up to
    ``min(max_num_seqs, largest)`` - which is itself included, so every decode batch the
    scheduler can form up to that size has a graph."""
    limit = min(max_num_seqs, largest)
    sizes = [size for size in (1, 2, 4) if size <= limit] + list(range(8, limit + 1, 8))
    if sizes[-1] != limit:
        sizes.append(limit)
    return sizes


def padded_size(num_reqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``num_reqs`` requests; None when none does
    (the step then runs eagerly)."""
    index = bisect.bisect_left(sizes, num_reqs)
    return sizes[index] if index < len(sizes) else None


@dataclass
class StaticDecodeInputs:
    """The buffers a captured graph reads: one row per request of the largest batch, one
    query token per request (so token ``i`` belongs to request ``i``)."""

    input_ids: torch.Tensor  # int64 [N]
    positions: torch.Tensor  # int64 [N]
    query_start_loc: torch.Tensor  # int32 [N + 1]: 0, 1, ..., N - fixed for decodes
    seq_lens: torch.Tensor  # int32 [N]
    block_tables: torch.Tensor  # int32 [N, max_blocks_per_req]
    slot_mapping: torch.Tensor  # int64 [N]

    @classmethod
    def allocate(cls, max_size: int, max_blocks: int, device: torch.device) -> StaticDecodeInputs:
        """Buffers holding an all-padding batch: safe to run (and capture) as they are."""
        return cls(
            input_ids=torch.zeros(max_size, dtype=torch.int64, device=device),
            positions=torch.zeros(max_size, dtype=torch.int64, device=device),
            query_start_loc=torch.arange(max_size + 1, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_size, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_size, max_blocks, dtype=torch.int32, device=device),
            slot_mapping=torch.full((max_size,), -1, dtype=torch.int64, device=device),
        )

    def metadata(self, size: int, max_model_len: int) -> AttentionMetadata:
        """The attention metadata of a ``size``-request decode step over these buffers."""
        return AttentionMetadata(
            num_actual_tokens=size,
            num_reqs=size,
            query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            max_query_len=1,
            max_seq_len=max_model_len,
        )

    def fill(self, step: StepInputs, size: int) -> None:
        """Copy a decode step of ``n <= size`` requests into rows ``0:n`` and make rows
        ``n:size`` padding."""
        meta = step.metadata
        n = meta.num_reqs
        if meta.max_query_len != 1 or meta.num_actual_tokens != n or n > size:
            raise ValueError(f"not a decode step of at most {size} requests: {n} requests, "
                             f"{meta.num_actual_tokens} tokens")
        self.input_ids[:n].copy_(step.input_ids)
        self.positions[:n].copy_(step.positions)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.input_ids[n:size] = 0
        self.positions[n:size] = 0
        self.seq_lens[n:size] = 0
        self.slot_mapping[n:size] = -1


class DecodeGraphs:
    """The captured decode graphs of one model and KV cache, and their replay."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], sizes: list[int],
                 max_blocks: int, max_model_len: int, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sizes
        self.max_model_len = max_model_len
        self.inputs = StaticDecodeInputs.allocate(sizes[-1], max_blocks, device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # Per size, the auxiliary hidden states the captured forward keeps for EAGLE-3
        # (``LlamaModel.aux_hidden_states``): a replay refills them, and ``run`` points the
        # model at this graph's, as an eager forward would.
        self.aux_states: dict[int, list[torch.Tensor]] = {}

    def _forward(self, size: int) -> torch.Tensor:
        inputs = self.inputs
        return self.model(inputs.input_ids[:size], inputs.positions[:size], self.kv_caches,
                          inputs.metadata(size, self.max_model_len))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, all in one memory pool (a smaller graph
        reuses the larger ones' activation memory)."""
        pool = None
        for size in reversed(self.sizes):
            self._forward(size)  # compiles the kernels and warms the allocator up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = (graph, hidden)
            self.aux_states[size] = list(self._kept_aux_states())
        torch.cuda.synchronize()

    def _kept_aux_states(self) -> list[torch.Tensor]:
        inner = getattr(self.model, "model", None)
        return getattr(inner, "aux_hidden_states", []) \
            if getattr(inner, "aux_hidden_state_layers", None) else []

    def fits(self, step: StepInputs) -> bool:
        """Whether a captured graph can run this step: decodes only, few enough of them,
        no prompt-embedding rows (a one-token chunk of a prompt given as embeddings)."""
        meta = step.metadata
        return (meta.max_query_len == 1 and meta.num_actual_tokens == meta.num_reqs
                and step.prompt_embeds is None
                and padded_size(meta.num_reqs, self.sizes) is not None)

    def run(self, step: StepInputs) -> torch.Tensor:
        """Hidden states ``[n, hidden]`` of a decode step, by replay. They live in the
        graph's memory until the next replay."""
        n = step.metadata.num_reqs
        size = padded_size(n, self.sizes)
        assert size is not None, "run() needs a step that fits()"
        self.inputs.fill(step, size)
        graph, hidden = self.graphs[size]
        graph.replay()
        if self.aux_states[size]:
            self.model.model.aux_hidden_states = [a[:n] for a in self.aux_states[size]]
        return hidden[:n]
