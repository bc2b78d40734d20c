"""What the heads learn from: the target's features and the tokens it said next.

The loss only scores positions inside the target's replies (its own greedy text); the
prompt still gives context. Logits are computed over the tokens that occur in the text
(``TokenSubset``) rather than the whole vocabulary: a token the target never said is never
a label, and the LM-head matmul over ~49k rows would otherwise dominate training on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo_spec_decode.train.data import Sequence


@dataclass
class TokenSubset:
    """Vocabulary rows that appear in the training text, and the map into them."""

    token_ids: torch.Tensor  # int64 [S]
    index_of: torch.Tensor  # int64 [vocab]: position in token_ids, -100 for absent tokens

    @classmethod
    def of(cls, sequences: list[Sequence], vocab_size: int) -> TokenSubset:
        token_ids = torch.unique(torch.cat([s.token_ids for s in sequences]))
        index_of = torch.full((vocab_size,), -100, dtype=torch.int64)
        index_of[token_ids] = torch.arange(len(token_ids))
        return cls(token_ids, index_of)

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """Logits over the subset for hidden states ``[..., h]`` (``lm_head`` [vocab, h])."""
        return hidden @ lm_head[self.token_ids].T


def split(sequences: list[Sequence], eval_fraction: float = 0.1,
          ) -> tuple[list[Sequence], list[Sequence]]:
    """Training and evaluation sequences (the last ``eval_fraction``, at least one)."""
    num_eval = max(1, int(len(sequences) * eval_fraction)) if len(sequences) > 1 else 0
    return sequences[:len(sequences) - num_eval], sequences[len(sequences) - num_eval:]


def reply_mask(seq: Sequence, offset: int) -> torch.Tensor:
    """``[L]`` True at positions ``t`` whose token ``t + offset`` is part of the reply."""
    positions = torch.arange(len(seq.token_ids)) + offset
    return (positions >= seq.num_prompt_tokens) & (positions < len(seq.token_ids))


def shifted_tokens(seq: Sequence, offset: int) -> torch.Tensor:
    """``[L]``: token ``t + offset`` at position ``t`` (0 past the end, masked anyway)."""
    ids = seq.token_ids
    out = torch.zeros_like(ids)
    if offset < len(ids):
        out[: len(ids) - offset] = ids[offset:]
    return out
