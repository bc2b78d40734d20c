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


# Top-k and top-p first look among each row's largest logits only: sorting 1024 of them is
# much cheaper than sorting the vocabulary (49k on SmolLM2, where the full sort took 40% of
# a 256-row sampling step on the CPU). A row whose kept set may reach past them - a larger
# top_k, or a distribution so flat that 1024 tokens hold less than top_p of its mass - is
# truncated by the full sort instead.
NUM_CANDIDATES = 1024


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, then the smallest set of the rest whose
    probability reaches ``top_p``."""
    if top_k is None and top_p is None:
        return logits
    if logits.shape[1] <= NUM_CANDIDATES:
        return _sort_and_truncate(logits, top_k, top_p)
    cutoff, resolved = _cutoff_among_candidates(logits, top_k, top_p)
    logits.masked_fill_(resolved.unsqueeze(1) & (logits < cutoff), float("-inf"))
    if not bool(resolved.all()):
        rows = (~resolved).nonzero().squeeze(1)
        logits[rows] = _sort_and_truncate(
            logits[rows], None if top_k is None else top_k[rows],
            None if top_p is None else top_p[rows])
    return logits


def _cutoff_among_candidates(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the smallest logit that top-k and top-p keep (``[B, 1]``), and whether the
    row's largest ``NUM_CANDIDATES`` logits settle it (``[B]``)."""
    values = logits.topk(NUM_CANDIDATES, dim=-1).values  # descending
    vocab_size = logits.shape[1]
    resolved = torch.ones(len(logits), dtype=torch.bool, device=logits.device)
    kth = torch.full_like(values[:, :1], float("-inf"))
    if top_k is not None:
        limited = top_k < vocab_size  # the others carry the vocabulary size: no limit
        resolved &= ~limited | (top_k <= NUM_CANDIDATES)
        index = (top_k.clamp(max=NUM_CANDIDATES) - 1).unsqueeze(1)
        kth = torch.where(limited.unsqueeze(1), values.gather(1, index), kth)
    if top_p is None:
        return kth, resolved
    # Probabilities after top-k, over the whole row: the candidates' share of the mass.
    total = torch.where(logits >= kth, logits, float("-inf")).logsumexp(dim=-1, keepdim=True)
    probs = torch.where(values >= kth, (values - total).exp(), 0.0)
    mass_before = probs.cumsum(dim=-1) - probs  # of the larger candidates
    # The sort keeps a token while the mass below it, 1 - mass_before, exceeds 1 - top_p.
    kept = (mass_before < top_p.unsqueeze(1)) & (values >= kth)
    resolved &= (top_p >= 1) | (probs.sum(dim=-1) >= top_p)
    last = (kept.sum(dim=-1, keepdim=True) - 1).clamp(min=0)
    cutoff = torch.where(top_p.unsqueeze(1) >= 1, kth, values.gather(1, last))
    return cutoff, resolved


def _sort_and_truncate(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Both filters from one ascending sort of the whole vocabulary."""
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
