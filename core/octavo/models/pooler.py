"""Pooling: from the hidden states of a step to one vector per finished prompt.

The step's tokens are flat (``starts``: each request's first token, and the end); a
request's vector is taken in the step its prompt is complete (``done``). ``CLS`` and
``MEAN`` read every token of the prompt, so they need it whole in that step (the pooling
runner's scheduler never splits such a prompt); ``LAST`` reads the last token only, so a
decoder's prompt may be computed in chunks before it. The raw vector is returned in fp32;
truncation (Matryoshka) and normalisation are the request's, applied in the front end.
"""

from __future__ import annotations

import numpy as np
import torch


def pool(hidden: torch.Tensor, starts: np.ndarray, done: np.ndarray,
         pooling_type: str) -> list[np.ndarray | None]:
    """For each request of the step: its pooled fp32 vector ``[hidden]`` where ``done``,
    else None. ``hidden``: ``[T, hidden]``; ``starts``: ``[requests + 1]`` token offsets."""
    rows = np.flatnonzero(done)
    result: list[np.ndarray | None] = [None] * len(done)
    if not len(rows):
        return result
    if pooling_type == "MEAN":
        pooled = _means(hidden, starts, rows)
    else:
        picks = starts[rows] if pooling_type == "CLS" else starts[rows + 1] - 1
        pooled = hidden[torch.from_numpy(picks.astype(np.int64)).to(hidden.device)].float()
    vectors = pooled.cpu().numpy()
    for i, row in enumerate(rows.tolist()):
        result[row] = vectors[i]
    return result


def _means(hidden: torch.Tensor, starts: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """The fp32 mean over each of ``rows``' tokens, ``[len(rows), hidden]``."""
    counts = starts[rows + 1] - starts[rows]
    owner = np.repeat(np.arange(len(rows)), counts)
    tokens = np.concatenate([np.arange(starts[r], starts[r + 1]) for r in rows])
    device = hidden.device
    sums = torch.zeros(len(rows), hidden.shape[1], dtype=torch.float32, device=device)
    sums.index_add_(0, torch.from_numpy(owner).to(device),
                    hidden[torch.from_numpy(tokens).to(device)].float())
    return sums / torch.from_numpy(counts).to(device=device, dtype=torch.float32)[:, None]
