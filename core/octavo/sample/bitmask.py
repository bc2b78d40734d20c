"""Applying a grammar bitmask to logits: every token a grammar forbids gets -inf.

The bitmask is what the scheduler's ``StructuredOutputManager`` sends: int32 words, bit
``t % 32`` of word ``t // 32`` set when token ``t`` is allowed. Unpacked here with tensor
ops on the logits' device (no loop over the vocabulary, no xgrammar in the worker), so any
platform's runner can use it.
"""

from __future__ import annotations

import numpy as np
import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[rows, vocab_size]``: which tokens each row allows. Ids past the bitmask's end
    (logits wider than the grammar's vocabulary) are not allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < vocab_size:
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    return allowed[:, :vocab_size]


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int]) -> None:
    """Mask, in place, logits row ``rows[i]`` with bitmask row ``i``."""
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    words = torch.from_numpy(np.ascontiguousarray(bitmask, dtype=np.int32)).to(logits.device)
    allowed = unpack_bitmask(words, logits.shape[1])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def grammar_rows(logits_req_ids: list[str], bitmask_req_ids: list[str],
                 ) -> tuple[list[int], list[int]]:
    """Match the bitmask's rows to the logits' rows by request id: ``(bitmask rows, logits
    rows)`` of the requests in both."""
    position = {req_id: i for i, req_id in enumerate(logits_req_ids)}
    pairs = [(i, position[req_id]) for i, req_id in enumerate(bitmask_req_ids)
             if req_id in position]
    return [i for i, _ in pairs], [row for _, row in pairs]
