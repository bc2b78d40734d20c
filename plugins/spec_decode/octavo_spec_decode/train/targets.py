"""What the heads learn from: the target's features and the tokens it would say next.

Labels are the target's greedy picks (``Sequence.next_tokens``), not the text: on a
sampled reply the next token is often not what greedy decoding - the only case whose
acceptance counts at temperature 0 - would say. The loss only scores positions inside the
replies; the prompt still gives context. Logits are computed over the tokens that occur in the text
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
        token_ids = torch.unique(torch.cat([s.token_ids for s in sequences] +
                                           [s.next_tokens for s in sequences
                                            if s.next_tokens is not None]))
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


def label_tokens(seq: Sequence, offset: int) -> torch.Tensor:
    """``[L]``: at position ``t``, the target's greedy pick for position ``t + offset``
    given the text before it (0 past the end, masked anyway)."""
    assert seq.next_tokens is not None and offset >= 1
    picks = seq.next_tokens
    out = torch.zeros_like(picks)
    if offset <= len(picks):
        out[: len(picks) - offset + 1] = picks[offset - 1:]
    return out


def on_greedy_path(seq: Sequence, span: int) -> torch.Tensor:
    """``[L]`` True at positions ``t`` whose next ``span`` tokens are each the target's greedy
    pick: there the text is what greedy decoding from ``t`` says. A Medusa head at ``t``
    sees only ``f_t``, so on a sampled reply its label after an off-greedy token is noise
    to it (it would have to guess what the sampling drew)."""
    assert seq.next_tokens is not None
    agrees = seq.token_ids[1:] == seq.next_tokens[:-1]  # [L-1]: token t+1 is t's greedy pick
    out = torch.ones(len(seq.token_ids), dtype=torch.bool)
    for j in range(span):
        follows = torch.zeros_like(out)
        follows[:len(agrees) - j] = agrees[j:]
        out &= follows
    return out
