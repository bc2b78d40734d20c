"""Turning the scheduled slice of the persistent batch into one step's model inputs.

All scheduled tokens of all requests become one flattened "super-sequence". Everything is
computed with vectorised numpy over the batch arrays - no per-token Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from octavo.attention import AttentionMetadata
from octavo.worker.input_batch import InputBatch


@dataclass
class StepInputs:
    rows: np.ndarray  # batch rows scheduled this step, in flattened order
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    metadata: AttentionMetadata
    # Rows whose every known token is computed after this step: they sample a token.
    sample_mask: np.ndarray  # bool [len(rows)]
    logits_indices: torch.Tensor  # int64 [num sampling rows]: their last token in the flat batch


def prepare_step(
    batch: InputBatch, num_scheduled: dict[str, int], block_size: int, device: torch.device
) -> StepInputs:
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
    return StepInputs(
        rows=rows,
        input_ids=on_device(input_ids),
        positions=on_device(positions),
        metadata=metadata,
        sample_mask=sample_mask,
        logits_indices=on_device(ends[sample_mask] - 1),
    )
