"""Applying a grammar bitmask to logits: every token a grammar forbids gets -inf.

The worker side of guided decoding. The bitmask is what the scheduler's
``StructuredOutputManager`` sends: int32 words, bit ``t % 32`` of word ``t // 32`` set when
token ``t`` is allowed. xgrammar's kernel applies
it (native code on the CPU, a Triton or CUDA kernel on GPUs): several times faster than
unpacking the bits with tensor ops, and no loop over the vocabulary. Imported with the first
bitmask, not at start-up.
"""

from __future__ import annotations

import numpy as np
import torch


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int]) -> None:
    """Mask, in place, logits row ``rows[i]`` with bitmask row ``i``. Ids past the bitmask's
    end (logits wider than the grammar's vocabulary) are masked too."""
    if not rows:
        return
    import xgrammar as xgr

    # xgrammar indexes the bitmask and the logits by the same row numbers.
    full = np.full((logits.shape[0], bitmask.shape[1]), -1, dtype=np.int32)
    full[rows] = bitmask
    covered = bitmask.shape[1] * 32
    xgr.apply_token_bitmask_inplace(logits, torch.from_numpy(full).to(logits.device),
                                    vocab_size=min(covered, logits.shape[1]), indices=rows)
    if logits.shape[1] > covered:
        logits[torch.tensor(rows, device=logits.device), covered:] = float("-inf")


def grammar_rows(logits_req_ids: list[str], bitmask_req_ids: list[str],
                 ) -> tuple[list[int], list[int]]:
    """Match the bitmask's rows to the logits' rows by request id: ``(bitmask rows, logits
    rows)`` of the requests in both."""
    position = {req_id: i for i, req_id in enumerate(logits_req_ids)}
    pairs = [(i, position[req_id]) for i, req_id in enumerate(bitmask_req_ids)
             if req_id in position]
    return [i for i, _ in pairs], [row for _, row in pairs]
