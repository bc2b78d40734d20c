"""Draft-model proposer: a smaller model with the same tokenizer guesses the next k tokens.

The draft model keeps its own paged KV cache with the *target's* block ids (its blocks are
counted into KV sizing through ``kv_cache_bytes_per_block``), so the scheduler's block
tables, prefix cache hits and lookahead slots serve both models. Each step it

1. runs over the step's tokens as they turned out - per request the accepted ones and the
   newest sampled token (``ProposeInputs.accepted_step``) - which writes their draft KV and
   gives the first draft from the last position;
2. runs ``k - 1`` single-token steps, feeding each draft back in.

Every request of the step goes through step 1, drafting or not, so the draft cache holds
the KV of every token the target's cache holds. Drafts are the draft model's argmax (a
one-hot proposal for the rejection sampler).
"""

from __future__ import annotations

import numpy as np
import torch

from octavo.plugin_api import (
    ConfigError,
    ProposeInputs,
    Proposer,
    ProposerContext,
    StepInputs,
    build_model,
    load_model_files,
)


class DraftModelProposer(Proposer):
    name = "draft_model"
    requires_model = True

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        assert context.config.model is not None  # SpeculativeConfig requires it
        files = load_model_files(context.config.model)
        vocab_size = int(files.hf_config["vocab_size"])
        if vocab_size != context.vocab_size:
            raise ConfigError(f"speculative_config: model {context.config.model!r} has a "
                              f"vocabulary of {vocab_size} tokens, the target {context.vocab_size}"
                              "; a draft model must share the target's tokenizer")
        self.model = build_model(files, context.dtype, context.attn_backend, context.device,
                                 architectures=context.architectures)
        context.platform.prepare_model(self.model, context.dtype)
        self.kv_caches: list[torch.Tensor] = []

    def kv_cache_bytes_per_block(self) -> int:
        model = self.model
        shape = self.context.attn_backend.kv_cache_shape(1, self.context.block_size,
                                                         model.num_kv_heads, model.head_dim)
        return int(np.prod(shape)) * torch.finfo(model.dtype).bits // 8 * model.num_layers

    def initialize_kv_cache(self, num_blocks: int) -> None:
        model = self.model
        shape = self.context.attn_backend.kv_cache_shape(num_blocks, self.context.block_size,
                                                         model.num_kv_heads, model.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=model.dtype, device=self.context.device)
                          for _ in range(model.num_layers)]

    @torch.inference_mode()
    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        context = self.context
        step = inputs.accepted_step(context.block_size, context.device)
        next_tokens = self._argmax(step)
        # Drafts per request: up to k, leaving room for the bonus token in max_model_len.
        room = np.minimum(self.num_speculative_tokens,
                          context.max_model_len - inputs.num_tokens - 1)
        num_drafts = np.where(inputs.wants_drafts, np.maximum(room, 0), 0)
        drafts = np.zeros((len(inputs.rows), self.num_speculative_tokens), dtype=np.int64)
        drafts[:, 0] = next_tokens
        assert inputs.block_table is not None
        for j in range(1, int(num_drafts.max(initial=0))):
            active = np.flatnonzero(num_drafts > j)
            # Draft j - 1 sits right after the request's tokens, at position num_tokens + j - 1.
            positions = inputs.num_tokens[active] + j - 1
            single = StepInputs.for_tokens(
                drafts[active, j - 1], positions, np.ones(len(active), np.int64),
                inputs.block_table[inputs.rows[active]], context.block_size, context.device)
            drafts[active, j] = self._argmax(single)
        return [drafts[i, :n].tolist() for i, n in enumerate(num_drafts.tolist())]

    def _argmax(self, step) -> np.ndarray:
        hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.metadata)
        return self.model.compute_logits(hidden[step.logits_indices]).argmax(-1).cpu().numpy()
