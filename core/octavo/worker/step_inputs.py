"""Turning the scheduled slice of the persistent batch into one step's model inputs.

All scheduled tokens of all requests become one flattened "super-sequence". Everything is
computed with vectorised numpy over the batch arrays - no per-token Python loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from octavo.attention import AttentionMetadata
from octavo.worker.input_batch import InputBatch


@dataclass
class PromptEmbedsInput:
    """The prompt-embedding rows of one step: the model's input at flat token
    ``indices`` (prompt positions of requests given as embeddings) is ``values``."""

    indices: torch.Tensor  # int64 [N], into the flattened step
    values: torch.Tensor  # [N, hidden], the model's dtype


@dataclass
class StepInputs:
    rows: np.ndarray  # batch rows scheduled this step, in flattened order
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    metadata: AttentionMetadata
    # Rows whose every known token is computed after this step: they sample a token.
    sample_mask: np.ndarray  # bool [len(rows)]
    logits_indices: torch.Tensor  # int64 [num sampling rows]: their last token in the flat batch
    # Prompt embeddings of the scheduled prompt positions that have them; None when none do.
    prompt_embeds: PromptEmbedsInput | None = None

    @classmethod
    def for_tokens(cls, input_ids: np.ndarray, positions: np.ndarray, counts: np.ndarray,
                   block_tables: np.ndarray, block_size: int,
                   device: torch.device) -> StepInputs:
        """The inputs of a ragged batch that is not the persistent batch's schedule - a
        proposer's own forward passes over a draft KV cache laid out with the target's
        block ids: ``counts[i]`` consecutive tokens per request (flattened in
        ``input_ids`` and ``positions``), request ``i`` owning ``block_tables[i]``. Every
        request samples at its last token."""
        ends = np.cumsum(counts)
        token_req = np.repeat(np.arange(len(counts)), counts)
        blocks = block_tables[token_req, positions // block_size].astype(np.int64)
        seq_lens = (positions[ends - 1] + 1).astype(np.int32)
        max_blocks = int(-(-int(seq_lens.max()) // block_size))
        query_start_loc = np.concatenate([[0], ends]).astype(np.int32)

        def on_device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        metadata = AttentionMetadata(
            num_actual_tokens=int(ends[-1]),
            num_reqs=len(counts),
            query_start_loc=on_device(query_start_loc),
            seq_lens=on_device(seq_lens),
            block_tables=on_device(block_tables[:, :max_blocks]),
            slot_mapping=on_device(blocks * block_size + positions % block_size),
            max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=torch.from_numpy(query_start_loc),
            seq_lens_cpu=torch.from_numpy(seq_lens),
        )
        return cls(
            rows=np.arange(len(counts)),
            input_ids=on_device(input_ids.astype(np.int64)),
            positions=on_device(positions.astype(np.int64)),
            metadata=metadata,
            sample_mask=np.ones(len(counts), dtype=bool),
            logits_indices=on_device(ends - 1),
        )


def prepare_step(
    batch: InputBatch, num_scheduled: dict[str, int], block_size: int, device: torch.device,
    rope_lengths: bool = False, state_slots: bool = False,
) -> StepInputs:
    """``rope_lengths``: fill ``AttentionMetadata.rope_lengths`` (a model whose RoPE
    depends on the sequence length); ``state_slots``: ``state_slots`` (a model with SSM
    layers)."""
    rows = np.sort(np.fromiter((batch.req_index[r] for r in num_scheduled), dtype=np.int64,
                               count=len(num_scheduled)))
    counts = np.fromiter((num_scheduled[batch.req_ids[r]] for r in rows), dtype=np.int64,
                         count=len(rows))
    ends = np.cumsum(counts)
    starts = ends - counts
    total = int(ends[-1])
    token_req = np.repeat(np.arange(len(rows)), counts)  # index into rows, per token
    token_row = rows[token_req]
    computed = batch.num_computed_tokens[rows]
    positions = computed[token_req] + (np.arange(total) - starts[token_req])
    input_ids = batch.token_ids[token_row, positions]
    blocks = batch.block_table[token_row, positions // block_size].astype(np.int64)
    slot_mapping = blocks * block_size + positions % block_size
    seq_lens = computed + counts
    max_blocks = int(-(-seq_lens.max() // block_size))
    query_start_loc = np.concatenate([[0], ends]).astype(np.int32)
    sample_mask = seq_lens >= batch.num_tokens[rows]

    def on_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    metadata = AttentionMetadata(
        num_actual_tokens=total,
        num_reqs=len(rows),
        query_start_loc=on_device(query_start_loc),
        seq_lens=on_device(seq_lens.astype(np.int32)),
        block_tables=on_device(batch.block_table[rows, :max_blocks]),
        slot_mapping=on_device(slot_mapping),
        max_query_len=int(counts.max()),
        max_seq_len=int(seq_lens.max()),
        query_start_loc_cpu=torch.from_numpy(query_start_loc),
        seq_lens_cpu=torch.from_numpy(seq_lens.astype(np.int32)),
    )
    if state_slots:
        metadata.state_slots = on_device(batch.state_slot[rows])
    if rope_lengths:
        metadata.rope_lengths = on_device(
            np.maximum(batch.num_prompt_tokens[token_row], positions + 1))
    if len(batch.block_tables) > 1:
        metadata.kv_groups = _group_metadata(metadata, batch, rows, token_row, positions,
                                             block_size, max_blocks, device)
    return StepInputs(
        rows=rows,
        input_ids=on_device(input_ids),
        positions=on_device(positions),
        metadata=metadata,
        sample_mask=sample_mask,
        logits_indices=on_device(ends[sample_mask] - 1),
        prompt_embeds=(_prompt_embeds(batch, rows, starts, counts, computed, device)
                       if batch.has_prompt_embeds[rows].any() else None),
    )


def _group_metadata(metadata: AttentionMetadata, batch: InputBatch, rows: np.ndarray,
                    token_row: np.ndarray, positions: np.ndarray, block_size: int,
                    max_blocks: int, device: torch.device) -> list[AttentionMetadata]:
    """Every KV group's metadata (``metadata`` is group 0's): the same layout, the group's
    own block tables and slots, and a ``backend_state`` of its own (what a backend derives
    from one group's block tables does not hold for another's)."""
    block_index = positions // block_size
    offsets = positions % block_size
    groups = [metadata]
    for table in batch.block_tables[1:]:
        slots = table[token_row, block_index].astype(np.int64) * block_size + offsets
        groups.append(dataclasses.replace(
            metadata,
            block_tables=torch.from_numpy(np.ascontiguousarray(table[rows, :max_blocks]))
            .to(device),
            slot_mapping=torch.from_numpy(slots).to(device),
            backend_state={}, kv_groups=[]))
    return groups


def _prompt_embeds(batch: InputBatch, rows: np.ndarray, starts: np.ndarray,
                   counts: np.ndarray, computed: np.ndarray,
                   device: torch.device) -> PromptEmbedsInput | None:
    """Each embedded request's rows for the prompt positions of its chunk (a chunked
    prefill takes its slice; positions past the prompt are output tokens, embedded as ids)."""
    indices: list[np.ndarray] = []
    values: list[torch.Tensor] = []
    for i in np.flatnonzero(batch.has_prompt_embeds[rows]).tolist():
        row = int(rows[i])
        first = int(computed[i])
        last = min(first + int(counts[i]), int(batch.num_prompt_tokens[row]))
        if last <= first:
            continue
        embeds = batch.states[batch.req_ids[row]].prompt_embeds
        assert embeds is not None
        indices.append(np.arange(starts[i], starts[i] + last - first))
        values.append(embeds[first:last])
    if not indices:
        return None
    return PromptEmbedsInput(torch.from_numpy(np.concatenate(indices)).to(device),
                             torch.cat(values))
