"""Truncation of the distribution: min-p, top-k and top-p, on temperature-scaled logits.

Each sets the logits of the tokens it drops to -inf. Rows that do not use a filter carry a
neutral value (min_p 0, top_k = vocab size, top_p 1), so one batched pass serves all rows.
"""

from __future__ import annotations

import torch


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens less likely than ``min_p`` times the row's most likely token."""
    probs = logits.softmax(dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, then the smallest set of the rest whose
    probability reaches ``top_p``. One ascending sort serves both filters."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1)
    if top_k is not None:
        # The k-th largest value sits k places from the end; ties with it are kept.
        kth = sorted_logits.gather(1, (logits.shape[1] - top_k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        # Ascending cumulative probability: drop the head whose mass is at most 1 - p.
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p.unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)
