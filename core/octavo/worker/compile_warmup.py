"""``-O``: compile the model at start-up, as vLLM does, so no request waits on the compiler.

The compiled forward (``Platform.compile_model``) compiles at its first call. Run from the
worker once the KV cache exists, ``warm_up_compiled`` makes that first call a dummy step: one
fresh two-token prompt in block 0. Its keys and values land in slots no request holds yet
(the cache is new, and a request's step writes its own slots before it reads them), and the
token dimension is dynamic, so every later step runs the graph compiled here.
"""

from __future__ import annotations

import logging

import torch

from octavo.attention.base import AttentionMetadata
from octavo.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

NUM_TOKENS = 2  # Dynamo specialises sizes 0 and 1: compile for a general size


@torch.inference_mode()
def warm_up_compiled(runner: ModelRunner) -> None:
    """One dummy forward through ``runner``'s compiled model; skipped (the first real step
    compiles instead) for a model with several KV groups, SSM state or no KV cache, whose
    dummy metadata would need more than this builds."""
    if runner.hybrid_kv or runner.ssm_layers or not runner.kv_caches:
        logger.info("-O: the first step compiles the model (no start-up compile for it)")
        return
    device = runner.device
    host = {"query_start_loc": torch.tensor([0, NUM_TOKENS], dtype=torch.int32),
            "seq_lens": torch.tensor([NUM_TOKENS], dtype=torch.int32)}
    positions = torch.arange(NUM_TOKENS, device=device)
    metadata = AttentionMetadata(
        num_actual_tokens=NUM_TOKENS, num_reqs=1,
        query_start_loc=host["query_start_loc"].to(device), seq_lens=host["seq_lens"].to(device),
        block_tables=torch.zeros(1, 1, dtype=torch.int32, device=device),
        slot_mapping=positions, max_query_len=NUM_TOKENS, max_seq_len=NUM_TOKENS,
        query_start_loc_cpu=host["query_start_loc"], seq_lens_cpu=host["seq_lens"],
        rope_lengths=(torch.full((NUM_TOKENS,), NUM_TOKENS, device=device)  # the prompt's
                      if runner.model.uses_rope_lengths else None))
    logger.info("-O: compiling the model's forward (once; Inductor's cache makes later "
                "starts faster)")
    runner.model(torch.zeros(NUM_TOKENS, dtype=torch.long, device=device), positions,
                  runner.kv_caches, metadata)
