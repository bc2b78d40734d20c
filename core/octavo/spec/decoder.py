"""``SpecDecoder``: the model runner's speculative-decoding side.

Each step it (1) writes the scheduled drafts into the persistent batch right after each
request's known tokens, so ``prepare_step`` flattens ``[last token, d_1..d_n]`` like any
other tokens; (2) after the one forward pass, takes the logits of all ``1 + n`` positions
of every drafting request and verifies them with the rejection sampler; (3) asks the
proposer for the next step's drafts.

Exactness with the request's sampling settings: position ``j`` of a request is processed
as if ``d_1..d_j`` were already its output (``output_token_ids`` extended per position),
so penalties, bad words and min_tokens see exactly what the plain sampler would have seen.
Requests that ask for ``logprobs`` do not speculate: their per-token logprobs would have to
be gathered for every accepted position, which the plain sampler path already does. Nor do
guided (structured-output) requests: their grammar bitmask covers one position per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from octavo.plugins import get_registries
from octavo.sample.params import SamplingParams
from octavo.sample.penalties import apply_penalties
from octavo.sample.processors import apply_logits_processors
from octavo.sample.sampler import truncated_probs
from octavo.spec.config import SpeculativeConfig
from octavo.spec.proposer import ProposeInputs, Proposer, ProposerContext
from octavo.spec.rejection import rejection_sample
from octavo.worker.input_batch import InputBatch
from octavo.worker.step_inputs import StepInputs

if TYPE_CHECKING:
    from octavo.worker.model_runner import ModelRunner


def can_speculate(params: SamplingParams) -> bool:
    """Whether a request may get drafts (see the module docstring)."""
    return params.logprobs is None and params.structured_outputs is None


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, runner: ModelRunner) -> None:
        self.config = config
        self.runner = runner
        proposer_cls: type[Proposer] = get_registries().proposers.get(config.method)
        model = runner.model
        self.proposer = proposer_cls(ProposerContext(
            config=config, target=model, attn_backend=runner.attn_backend,
            device=runner.device, dtype=model.dtype, block_size=runner.block_size,
            max_model_len=runner.batch.max_model_len, max_num_reqs=runner.batch.max_num_reqs,
            vocab_size=runner.vocab_size))
        if self.proposer.needs_prenorm_hidden_states:
            model.model.keep_prenorm_hidden = True

    @staticmethod
    def place_drafts(batch: InputBatch, drafts: dict[str, list[int]]) -> None:
        """Write each request's drafts after its known tokens (``num_tokens`` unchanged:
        they become tokens only once accepted)."""
        for req_id, tokens in drafts.items():
            row = batch.req_index[req_id]
            start = int(batch.num_tokens[row])
            batch.token_ids[row, start : start + len(tokens)] = tokens

    @staticmethod
    def draft_mask(step: StepInputs, batch: InputBatch, drafts: dict[str, list[int]],
                   ) -> np.ndarray:
        """bool [len(step.rows)]: the step's requests that verify drafts."""
        return np.fromiter((batch.req_ids[row] in drafts for row in step.rows.tolist()),
                           dtype=bool, count=len(step.rows))

    def verify(self, step: StepInputs, hidden: torch.Tensor, mask: np.ndarray,
               drafts: dict[str, list[int]], sampled: list[list[int]]) -> None:
        """Rejection-sample the drafting requests of ``mask``; their accepted tokens are
        appended to the batch and put in ``sampled``."""
        runner, batch = self.runner, self.runner.batch
        device = runner.device
        rows = step.rows[mask]
        req_ids = [batch.req_ids[row] for row in rows.tolist()]
        draft_lists = [drafts[req_id] for req_id in req_ids]
        num_drafts = np.array([len(d) for d in draft_lists], dtype=np.int64)
        counts = num_drafts + 1
        assert step.metadata.query_start_loc_cpu is not None
        starts = step.metadata.query_start_loc_cpu.numpy()[:-1][mask].astype(np.int64)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        flat = np.repeat(starts, counts) + offsets
        logits = runner.model.compute_logits(hidden[torch.from_numpy(flat).to(device)])

        outputs = [batch.states[req_id].output_token_ids + d[:j]
                   for req_id, d in zip(req_ids, draft_lists) for j in range(len(d) + 1)]
        metadata = runner.sampling_metadata(np.repeat(rows, counts), output_token_ids=outputs)
        logits = logits.to(torch.float32, copy=True)
        logits = apply_penalties(apply_logits_processors(logits, metadata), metadata)
        flat_argmax = logits.argmax(dim=-1)
        flat_probs = None if metadata.all_greedy else truncated_probs(logits, metadata)

        # Padded [B, K + 1] views of the flat positions (the padding repeats a row's last).
        k = int(num_drafts.max())
        first = np.cumsum(counts) - counts
        index = first[:, None] + np.minimum(np.arange(k + 1)[None, :], num_drafts[:, None])
        index_t = torch.from_numpy(index).to(device)
        draft_ids = np.zeros((len(rows), k), dtype=np.int64)
        for i, d in enumerate(draft_lists):
            draft_ids[i, : len(d)] = d
        generators = {i: g for i, req_id in enumerate(req_ids)
                      if (g := batch.states[req_id].generator) is not None}
        out = rejection_sample(
            torch.from_numpy(draft_ids).to(device),
            torch.from_numpy(num_drafts).to(device),
            flat_argmax[index_t],
            None if flat_probs is None else flat_probs[index_t],
            metadata.temperature[torch.from_numpy(first).to(device)] == 0,
            generators=generators,
        )
        for pos, row, tokens in zip(np.flatnonzero(mask).tolist(), rows.tolist(),
                                    out.tolists()):
            for token in tokens:
                batch.append_token(row, token)
            sampled[pos] = tokens

    def propose(self, step: StepInputs, hidden: torch.Tensor, sampled: list[list[int]],
                drafts: dict[str, list[int]]) -> list[list[int]]:
        """The next step's drafts for each request of the step (``[]`` for none)."""
        batch, model = self.runner.batch, self.runner.model
        rows = step.rows
        req_ids = [batch.req_ids[row] for row in rows.tolist()]
        num_draft_tokens = np.array([len(drafts.get(r, ())) for r in req_ids], dtype=np.int64)
        num_sampled = np.array([len(s) for s in sampled], dtype=np.int64)
        assert step.metadata.query_start_loc_cpu is not None
        bounds = step.metadata.query_start_loc_cpu.numpy().astype(np.int64)
        last = bounds[1:] - 1 - num_draft_tokens + np.maximum(num_sampled - 1, 0)
        wants = np.array([bool(s) and can_speculate(batch.states[r].sampling_params)
                          for r, s in zip(req_ids, sampled)], dtype=bool)
        inputs = ProposeInputs(
            req_ids=req_ids,
            rows=rows,
            token_ids=batch.token_ids,
            num_tokens=batch.num_tokens[rows].copy(),
            sampled_token_ids=sampled,
            wants_drafts=wants,
            step=step,
            num_draft_tokens=num_draft_tokens,
            last_token_indices=torch.from_numpy(last).to(self.runner.device),
            hidden_states=hidden if self.proposer.needs_hidden_states else None,
            prenorm_hidden_states=(model.model.prenorm_hidden
                                   if self.proposer.needs_prenorm_hidden_states else None),
            block_table=batch.block_table,
        )
        proposals = self.proposer.propose(inputs)
        k = self.config.num_speculative_tokens
        return [list(p[:k]) if want else [] for p, want in zip(proposals, wants.tolist())]
