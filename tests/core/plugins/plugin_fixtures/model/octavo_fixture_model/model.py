"""The fixture's architectures, built only from the plugin API's layers, so they shard under
tensor and pipeline parallelism as the core's Llama does."""

from __future__ import annotations

from typing import Any

import torch

from octavo.plugin_api import LlamaForCausalLM


class NegatedLlamaForCausalLM(LlamaForCausalLM):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return -super().compute_logits(hidden)


POISON_TOKEN_ID = 13  # a prompt holding it makes rank 0's step raise


class RaisingLlamaForCausalLM(LlamaForCausalLM):
    """The Llama, but rank 0's forward raises on a prompt holding ``POISON_TOKEN_ID``: a
    step that fails on one rank of several, while its peers wait for it in a collective."""

    def forward(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.ranks.rank == 0 and bool((input_ids == POISON_TOKEN_ID).any()):
            raise RuntimeError(f"rank 0 met the poison token {POISON_TOKEN_ID}")
        return super().forward(input_ids, *args, **kwargs)
