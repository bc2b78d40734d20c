"""``SpecVerifier``: the model runner's speculative-decoding side.

Each step it (1) writes the scheduled drafts into the persistent batch right after each
request's known tokens, so ``prepare_step`` flattens ``[last token, d_1..d_n]`` like any
other tokens; (2) after the one forward pass, takes the logits of all ``1 + n`` positions
of every drafting request and verifies them with the rejection sampler; (3) asks the
proposer for the next step's drafts.

With a draft tree (``octavo.spec_decode.tree``, Medusa's candidate trees) the drafts of a request
are tree nodes: before the forward pass their positions become the tree's depths and the
attention backend gets the tree's mask; after it, the verifier follows one path through
the tree (the one greedy decoding accepts, or for a sampled request the fixed chain of
first choices) and runs the same rejection sampler on it, then moves the accepted nodes'
KV to the slots of the positions they now hold.

Exactness with the request's sampling settings: position ``j`` of a request is processed
as if ``d_1..d_j`` were already its output (``output_token_ids`` extended per position),
so penalties, bad words and min_tokens see exactly what the plain sampler would have seen.
Requests that ask for ``logprobs`` do not speculate: their per-token logprobs would have to
be gathered for every accepted position, which the plain sampler path already does. Nor do
guided (structured-output) requests: their grammar bitmask covers one position per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from octavo.attention.base import AttentionBackend, TokenTrees
from octavo.config import ConfigError
from octavo.config.speculative import SpeculativeConfig
from octavo.models.base import CausalLM
from octavo.platforms import Platform
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.penalties import apply_penalties
from octavo.sample.processors import apply_logits_processors
from octavo.sample.sampler import truncated_probs
from octavo.sampling_params import SamplingParams
from octavo.spec_decode.rejection import rejection_sample
from octavo.spec_decode.tree import DraftTree
from octavo.worker.input_batch import InputBatch
from octavo.worker.spec_decode.proposer import ProposeInputs, Proposer, ProposerContext
from octavo.worker.step_inputs import StepInputs


class RunnerState(Protocol):
    """What the verifier reads of the model runner it serves (``ModelRunner``), named here
    so that the runner module and this one do not import each other."""

    model: CausalLM
    attn_backend: type[AttentionBackend]
    device: torch.device
    block_size: int
    vocab_size: int
    batch: InputBatch
    kv_caches: list[torch.Tensor]

    def sampling_metadata(self, rows: np.ndarray,
                          output_token_ids: list[list[int]] | None = None) -> SamplingMetadata:
        ...


def can_speculate(params: SamplingParams) -> bool:
    """Whether a request may get drafts (see the module docstring)."""
    return params.logprobs is None and params.structured_outputs is None


class SpecVerifier:
    def __init__(self, config: SpeculativeConfig, runner: RunnerState,
                 proposer_cls: type[Proposer], platform: type[Platform],
                 architectures: Mapping[str, type[CausalLM]]) -> None:
        self.config = config
        self.runner = runner
        self.tree = self._checked_tree(config, proposer_cls, runner.attn_backend)
        model = runner.model
        self.proposer = proposer_cls(ProposerContext(
            config=config, target=model, attn_backend=runner.attn_backend,
            device=runner.device, dtype=model.dtype, block_size=runner.block_size,
            max_model_len=runner.batch.max_model_len, max_num_reqs=runner.batch.max_num_reqs,
            vocab_size=runner.vocab_size, platform=platform,
            architectures=architectures))
        if self.proposer.needs_prenorm_hidden_states:
            model.model.keep_prenorm_hidden = True
        if self.proposer.aux_hidden_state_layers:
            model.model.aux_hidden_state_layers = frozenset(self.proposer.aux_hidden_state_layers)
        self.ancestors = self.tree.attention_mask() if self.tree is not None else None
        self.max_drafts = config.max_drafts
        # Flat index of the last accepted token of each request verified this step, by its
        # place in the step (in a tree, any node); propose() reads and clears it.
        self._last_accepted: dict[int, int] = {}

    @staticmethod
    def _checked_tree(config: SpeculativeConfig, proposer: type[Proposer],
                      backend: type[AttentionBackend]) -> DraftTree | None:
        """The configured tree, if it is one (a chain-shaped tree is just drafts)."""
        tree = DraftTree.of(config)
        if tree is None or tree.is_chain:
            return None
        if not proposer.supports_token_tree:
            raise ConfigError(f"speculative_config: method {config.method!r} does not draft "
                              f"token trees; drop speculative_token_tree")
        if not backend.supports_token_trees:
            raise ConfigError(f"speculative_config: the {backend.name!r} attention backend "
                              f"cannot verify token trees; drop speculative_token_tree")
        return tree

    def mark_trees(self, step: StepInputs, mask: np.ndarray) -> None:
        """Before the forward pass: the tree requests of ``mask`` get their nodes' depths as
        positions and the attention backend the tree's mask."""
        if self.tree is None or not mask.any():
            return
        assert step.metadata.query_start_loc_cpu is not None and self.ancestors is not None
        bounds = step.metadata.query_start_loc_cpu.numpy().astype(np.int64)
        positions = step.positions.cpu().numpy().copy()
        for start, end in zip(bounds[:-1][mask].tolist(), bounds[1:][mask].tolist()):
            positions[start + 1:end] = positions[start] + self.tree.depths[:end - start - 1]
        step.positions = torch.from_numpy(positions).to(step.positions.device)
        step.metadata.token_trees = TokenTrees(frozenset(np.flatnonzero(mask).tolist()),
                                               self.ancestors)

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
        counts = np.array([len(d) + 1 for d in draft_lists], dtype=np.int64)
        assert step.metadata.query_start_loc_cpu is not None
        starts = step.metadata.query_start_loc_cpu.numpy()[:-1][mask].astype(np.int64)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        flat = np.repeat(starts, counts) + offsets
        logits = runner.model.compute_logits(hidden[torch.from_numpy(flat).to(device)])

        outputs = [batch.states[req_id].output_token_ids + [d[n] for n in self._path_to(j)]
                   for req_id, d in zip(req_ids, draft_lists) for j in range(len(d) + 1)]
        metadata = runner.sampling_metadata(np.repeat(rows, counts), output_token_ids=outputs)
        logits = logits.to(torch.float32, copy=True)
        logits = apply_penalties(apply_logits_processors(logits, metadata), metadata)
        flat_argmax = logits.argmax(dim=-1)
        flat_probs = None if metadata.all_greedy else truncated_probs(logits, metadata)

        first = np.cumsum(counts) - counts
        is_greedy = metadata.temperature[torch.from_numpy(first).to(device)] == 0
        paths = self._paths(draft_lists, flat_argmax.tolist(), first, is_greedy.tolist())
        # Padded [B, K + 1] views of each path's positions (the padding repeats its last).
        num_drafts = np.array([len(p) for p in paths], dtype=np.int64)
        k = int(num_drafts.max())
        index = np.zeros((len(rows), k + 1), dtype=np.int64)
        draft_ids = np.zeros((len(rows), k), dtype=np.int64)
        for i, (path, d) in enumerate(zip(paths, draft_lists)):
            nodes = [0] + [n + 1 for n in path]
            index[i] = first[i] + np.array(nodes + nodes[-1:] * (k - len(path)))
            draft_ids[i, :len(path)] = [d[n] for n in path]
        index_t = torch.from_numpy(index).to(device)
        generators = {i: g for i, req_id in enumerate(req_ids)
                      if (g := batch.states[req_id].generator) is not None}
        out = rejection_sample(
            torch.from_numpy(draft_ids).to(device),
            torch.from_numpy(num_drafts).to(device),
            flat_argmax[index_t],
            None if flat_probs is None else flat_probs[index_t],
            is_greedy,
            generators=generators,
        )
        moves: list[tuple[int, int]] = []  # (from, to) flat indices of accepted tree nodes
        positions = np.flatnonzero(mask).tolist()
        for pos, row, tokens, path, start in zip(positions, rows.tolist(), out.tolists(),
                                                 paths, starts.tolist()):
            for token in tokens:
                batch.append_token(row, token)
            sampled[pos] = tokens
            accepted = path[:len(tokens) - 1]
            moves += [(start + 1 + node, start + 1 + depth)
                      for depth, node in enumerate(accepted) if node != depth]
            self._last_accepted[pos] = start + (1 + accepted[-1] if accepted else 0)
        if moves:
            self._move_kv(step, moves)

    def _path_to(self, position: int) -> list[int]:
        """The drafts output before the token sampled at query ``position`` (0: the last
        token, ``j``: draft ``j - 1``)."""
        if self.tree is None:
            return list(range(position))
        return self.tree.path_to(position - 1)

    def _paths(self, draft_lists: list[list[int]], argmax: list[int], first: np.ndarray,
               is_greedy: list[bool]) -> list[list[int]]:
        """Per request, the draft nodes the chain rejection sampler verifies: all of a
        chain; of a tree, the greedy path or the fixed first-choice path."""
        if self.tree is None:
            return [list(range(len(d))) for d in draft_lists]
        return [self.tree.greedy_path(d, argmax[f:f + len(d) + 1]) if greedy
                else self.tree.first_choice_path(len(d))
                for d, f, greedy in zip(draft_lists, first.tolist(), is_greedy)]

    def _move_kv(self, step: StepInputs, moves: list[tuple[int, int]]) -> None:
        """Put the accepted tree nodes' keys and values at the positions they now hold."""
        flat = torch.tensor(moves, dtype=torch.int64).to(self.runner.device)
        slots = step.metadata.slot_mapping[flat]
        for kv_cache in self.runner.kv_caches:
            self.runner.attn_backend.move_kv(kv_cache, slots[:, 0], slots[:, 1])

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
        for pos, index in self._last_accepted.items():
            last[pos] = index
        self._last_accepted = {}
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
            aux_hidden_states=(model.model.aux_hidden_states
                               if self.proposer.aux_hidden_state_layers else None),
            block_table=batch.block_table,
        )
        proposals = self.proposer.propose(inputs)
        return [list(p[:self.max_drafts]) if want else []
                for p, want in zip(proposals, wants.tolist())]
