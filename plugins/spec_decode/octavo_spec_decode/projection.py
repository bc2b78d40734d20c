"""``DraftProjection``: a head's hidden states to logits over its draft vocabulary.

Drafting ends in a matmul with the target's LM head: for SmolLM2-135M 49k rows, the bytes of
a fifth of the model, read once per draft step (EAGLE: k times a step; Medusa: once for all
heads). Heads trained by ``octavo spec train`` only ever learnt the tokens of their
training text (about 15k), and carry that draft vocabulary in their checkpoint as EAGLE-3's
``d2t``; projecting onto those rows alone does a third of the work and drafts nothing the
heads could not have learnt. Without a draft vocabulary the target's LM head is used whole.
An EAGLE-3 head brings its own LM head over its draft vocabulary (``weight``), used as is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from octavo.plugin_api import CausalLM, Platform, PPMissingLayer


def lm_head_weight(target: CausalLM) -> torch.Tensor:
    """The target's LM head ``[vocab, hidden]`` (this rank's rows) in the model's dtype:
    speculative decoding runs on one worker, which holds it. A quantized head (a GGUF's
    blocks) gives a dequantized copy."""
    lm_head = target.lm_head
    assert not isinstance(lm_head, PPMissingLayer), "speculative decoding on one stage only"
    return lm_head.dense_weight()


class DraftProjection(nn.Module):
    """A module only so that the platform can give its weight a faster GEMM
    (``Platform.prepare_model`` fills ``cpu_gemm`` on the CPU), as it does the target's."""

    def __init__(self, target: CausalLM, draft_token_ids: torch.Tensor | None,
                 dtype: torch.dtype, device: torch.device, platform: type[Platform],
                 weight: torch.Tensor | None = None) -> None:
        """``weight``: the head's own LM head, row ``i`` for token ``draft_token_ids[i]``
        (EAGLE-3); None: the rows of the target's."""
        super().__init__()
        self.target = [target]  # in a list: not a submodule of the projection
        # A tensor-parallel LM head holds a slice of the vocabulary: use it whole.
        if weight is None and getattr(target.lm_head, "tp_size", 1) > 1:
            draft_token_ids = None
        self.token_ids = None if draft_token_ids is None else draft_token_ids.to(device)
        self.weight: torch.Tensor | None  # the draft vocabulary's rows (None: use the target)
        if weight is not None:
            assert self.token_ids is not None and len(weight) == len(self.token_ids)
            self.weight = weight.detach().to(device=device, dtype=dtype).contiguous()
        else:
            self.weight = None if self.token_ids is None else \
                lm_head_weight(target)[self.token_ids].to(dtype).contiguous()
        self.cpu_gemm: Callable[[torch.Tensor], torch.Tensor] | None = None
        if self.weight is not None:
            platform.prepare_model(self, dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 ``[N, columns]``; column ``c`` is token ``tokens(c)``."""
        if self.weight is None:
            return self.target[0].compute_logits(hidden)
        return (self.cpu_gemm(hidden) if self.cpu_gemm is not None
                else F.linear(hidden, self.weight)).float()

    def tokens(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.token_ids is None else self.token_ids[columns]
