"""The fixture's architecture, built only from the plugin API's layers, so it shards under
tensor parallelism as the core's Llama does."""

from __future__ import annotations

import torch

from octavo.plugin_api import LlamaForCausalLM


class NegatedLlamaForCausalLM(LlamaForCausalLM):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return -super().compute_logits(hidden)
