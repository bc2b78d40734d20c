"""Logprobs to return: the chosen token's logprob and rank plus the top-n of each row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.outputs import LogprobsLists


@dataclass
class LogprobsTensors:
    """Column 0 is the chosen token (sampled, or the actual next prompt token), columns
    1..n the top-n tokens by logprob; the tensor form of ``LogprobsLists``."""

    token_ids: torch.Tensor  # int64 [N, n + 1]
    logprobs: torch.Tensor  # float32 [N, n + 1]
    ranks: torch.Tensor  # int64 [N]: rank of the chosen token, 1 = most likely

    def tolists(self) -> LogprobsLists:
        """Plain numpy arrays for the worker boundary."""
        return LogprobsLists(
            token_ids=self.token_ids.cpu().numpy(),
            logprobs=self.logprobs.cpu().numpy(),
            ranks=self.ranks.cpu().numpy(),
        )


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """From ``logprobs`` [N, V], the logprob and rank of ``token_ids`` [N] and the top
    ``num_logprobs`` of each row. A rank counts the tokens at least as likely (as vLLM)."""
    vocab_size = logprobs.shape[1]
    if not 0 <= num_logprobs <= vocab_size:
        raise ValueError(f"num_logprobs must be in [0, {vocab_size}], got {num_logprobs}")
    chosen_ids = token_ids.long().unsqueeze(1)
    chosen = logprobs.gather(1, chosen_ids)
    top, top_ids = logprobs.topk(num_logprobs, dim=1)
    return LogprobsTensors(
        token_ids=torch.cat([chosen_ids, top_ids], dim=1),
        logprobs=torch.cat([chosen, top], dim=1),
        ranks=(logprobs >= chosen).sum(dim=1),
    )


def compute_prompt_logprobs(
    logits: torch.Tensor, next_token_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """Prompt logprobs for a slice of positions: ``logits`` [T, V] are the model's raw
    logits at T prompt positions and ``next_token_ids`` [T] the prompt tokens that follow
    them. No logits processor applies to the prompt, as in vLLM."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return gather_logprobs(logprobs, next_token_ids, num_logprobs)
