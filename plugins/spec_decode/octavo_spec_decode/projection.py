"""``DraftProjection``: a head's hidden states to logits over its draft vocabulary.

Drafting ends in a matmul with the target's LM head: for SmolLM2-135M 49k rows, the bytes of
a fifth of the model, read once per draft step (EAGLE: k times a step; Medusa: once for all
heads). Heads trained by ``octavo spec train`` only ever learnt the tokens of their
training text (about 15k), and carry that draft vocabulary in their checkpoint as EAGLE-3's
``d2t``; projecting onto those rows alone does a third of the work and drafts nothing the
heads could not have learnt. Without a draft vocabulary the target's LM head is used whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.models.base import CausalLM
from octavo.models.layers.cpu_gemm import CpuGemm, cpu_gemm_supported


class DraftProjection:
    def __init__(self, target: CausalLM, draft_token_ids: torch.Tensor | None,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.target = target
        # A tensor-parallel LM head holds a slice of the vocabulary: use it whole.
        if getattr(target.lm_head, "tp_size", 1) > 1:
            draft_token_ids = None
        self.token_ids = None if draft_token_ids is None else draft_token_ids.to(device)
        self.weight = None if self.token_ids is None else \
            target.lm_head.weight[self.token_ids].to(dtype).contiguous()
        self.gemm = CpuGemm(self.weight, None, fp32_for_large=False) \
            if self.weight is not None and cpu_gemm_supported(dtype, device) else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 ``[N, columns]``; column ``c`` is token ``tokens(c)``."""
        if self.weight is None:
            return self.target.compute_logits(hidden)
        return (self.gemm(hidden) if self.gemm is not None
                else F.linear(hidden, self.weight)).float()

    def tokens(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.token_ids is None else self.token_ids[columns]
