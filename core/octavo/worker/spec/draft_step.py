"""Model inputs for a proposer's own forward passes (a draft model, an EAGLE head).

A proposer with its own paged KV cache, laid out with the target's block ids, runs over
tokens the target's step did not have: each request's *accepted* tokens of the step plus
its newest token, then one draft at a time. ``build_step`` turns such a ragged batch
(tokens, their positions, per-request counts) into the same ``StepInputs`` the target's
runner uses, with slots taken from the target's block tables.
"""

from __future__ import annotations

import numpy as np
import torch

from octavo.attention.base import AttentionMetadata
from octavo.worker.spec.proposer import ProposeInputs
from octavo.worker.step_inputs import StepInputs


def build_step(input_ids: np.ndarray, positions: np.ndarray, counts: np.ndarray,
               block_tables: np.ndarray, block_size: int, device: torch.device) -> StepInputs:
    """``counts[i]`` consecutive tokens per request (flattened in ``input_ids`` and
    ``positions``), request ``i`` owning ``block_tables[i]``. Every request samples at its
    last token."""
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
    return StepInputs(
        rows=np.arange(len(counts)),
        input_ids=on_device(input_ids.astype(np.int64)),
        positions=on_device(positions.astype(np.int64)),
        metadata=metadata,
        sample_mask=np.ones(len(counts), dtype=bool),
        logits_indices=on_device(ends - 1),
    )


def accepted_step(inputs: ProposeInputs, block_size: int, device: torch.device) -> StepInputs:
    """The step's tokens as they turned out: per request, the scheduled tokens that were
    not drafts, the drafts it accepted and the token it sampled (``[last token, accepted
    drafts, bonus]`` for a verifying request; the chunk, plus the first output token when
    the prompt is done, for a prefill)."""
    assert inputs.step.metadata.query_start_loc_cpu is not None
    assert inputs.block_table is not None
    bounds = inputs.step.metadata.query_start_loc_cpu.numpy().astype(np.int64)
    first_positions = inputs.step.positions.cpu().numpy()[bounds[:-1]]
    num_sampled = np.array([len(s) for s in inputs.sampled_token_ids], dtype=np.int64)
    counts = np.diff(bounds) - inputs.num_draft_tokens + num_sampled
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.repeat(first_positions, counts) + offsets
    token_rows = np.repeat(inputs.rows, counts)
    return build_step(inputs.token_ids[token_rows, positions], positions, counts,
                      inputs.block_table[inputs.rows], block_size, device)
