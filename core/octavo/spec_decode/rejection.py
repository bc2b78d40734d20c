"""The rejection sampler: verify a batch of drafts so that the output distribution is
exactly the target model's (Leviathan et al. 2023; Chen et al. 2023).

Per request with ``n`` drafts ``d_1..d_n`` the target gives ``n + 1`` distributions
``p_0..p_n`` (``p_j``: the next token after the context and ``d_1..d_j``), each *after* the
request's own sampling settings. Walking the drafts in order:

- greedy requests accept ``d_j`` while it equals the argmax of ``p_{j-1}``;
- random requests accept ``d_j`` with probability ``min(1, p(d_j) / q(d_j))``, ``q`` being
  the proposer's distribution (one-hot on the draft when ``draft_probs`` is None: n-gram and
  greedy drafts), i.e. when ``u * q(d_j) < p(d_j)`` for ``u ~ U[0, 1)``.

At the first rejection one token is drawn from ``normalize(max(0, p - q))`` (the residual;
for a one-hot ``q`` that is ``p`` without the draft); when every draft is accepted a bonus
token is drawn from ``p_n``. Either way each request gains ``accepted + 1`` tokens, and each
of them has the target's distribution given the ones before it.

Seeded requests draw their uniforms (for the drafts and for the final token) from their own
generator, a fixed number of draws per step, so they stay reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.sample.sampler import draw_tokens, uniform_rows


@dataclass
class RejectionOutput:
    token_ids: torch.Tensor  # int64 [B, K + 1]: accepted drafts then the final token; -1 after
    num_accepted: torch.Tensor  # int64 [B]: drafts accepted per request

    def tolists(self) -> list[list[int]]:
        counts = (self.num_accepted + 1).tolist()
        return [row[:n] for row, n in zip(self.token_ids.tolist(), counts)]


def rejection_sample(
    draft_token_ids: torch.Tensor,  # int64 [B, K], padded past each row's num_drafts
    num_drafts: torch.Tensor,  # int64 [B]
    target_argmax: torch.Tensor,  # int64 [B, K + 1]: argmax of the processed logits
    target_probs: torch.Tensor | None,  # float32 [B, K + 1, V]; None when every row is greedy
    is_greedy: torch.Tensor,  # bool [B]
    draft_probs: torch.Tensor | None = None,  # float32 [B, K, V]; None: one-hot drafts
    generators: dict[int, torch.Generator] | None = None,  # row -> a seeded row's generator
) -> RejectionOutput:
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    generators = generators or {}
    positions = torch.arange(k, device=device)
    valid = positions < num_drafts.unsqueeze(1)
    accept = draft_token_ids == target_argmax[:, :k]
    if target_probs is not None:
        uniform = uniform_rows(torch.empty(batch, k, device=device), generators)
        p_draft = target_probs[:, :k].gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)
        q_draft = (torch.ones_like(p_draft) if draft_probs is None
                   else draft_probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2))
        accept = torch.where(is_greedy.unsqueeze(1), accept, uniform * q_draft < p_draft)
    accept &= valid
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)

    rows = torch.arange(batch, device=device)
    final = target_argmax[rows, num_accepted]
    if target_probs is not None:
        drawn = draw_tokens(
            _final_distribution(target_probs, draft_probs, draft_token_ids, num_accepted,
                                num_drafts), generators)
        final = torch.where(is_greedy, final, drawn)

    token_ids = torch.full((batch, k + 1), -1, dtype=torch.long, device=device)
    token_ids[:, :k] = torch.where(positions < num_accepted.unsqueeze(1), draft_token_ids, -1)
    token_ids[rows, num_accepted] = final
    return RejectionOutput(token_ids, num_accepted)


def _final_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_token_ids: torch.Tensor,
    num_accepted: torch.Tensor, num_drafts: torch.Tensor,
) -> torch.Tensor:
    """Per row, what the last token is drawn from (unnormalised): the residual
    ``max(0, p - q)`` at the first rejected position, or ``p`` after the last draft."""
    rows = torch.arange(target_probs.shape[0], device=target_probs.device)
    p = target_probs[rows, num_accepted].clone()
    rejected = num_accepted < num_drafts
    at = num_accepted.clamp(max=draft_token_ids.shape[1] - 1)
    if draft_probs is None:
        q = torch.zeros_like(p)
        q[rows, draft_token_ids[rows, at]] = 1.0
    else:
        q = draft_probs[rows, at]
    residual = (p - q).clamp_(min=0)
    # Rounding can leave no mass where p and q agree; p itself is then the right answer.
    usable = rejected & (residual.sum(dim=1) > 0)
    return torch.where(usable.unsqueeze(1), residual, p)
