"""``Proposer``: the worker-side interface every speculative-decoding method implements.

A proposer is registered by name through the ``octavo_register_proposers`` hook (the
octavo-spec-decode plugin registers ngram, draft_model, medusa, eagle and eagle3) and built
once per worker, next to the target model. After each step's sampling the model runner
calls :meth:`Proposer.propose` with a :class:`ProposeInputs`; the drafts it returns travel
back to the scheduler, which schedules ``1 + len(drafts)`` tokens for the request in the
next step, and the runner verifies them all in one forward pass of the target model with
the rejection sampler (``octavo.spec_decode.rejection``).

Drafts are treated as proposals from a one-hot distribution (as vLLM does for n-gram and
EAGLE): the rejection sampler then keeps the target's output distribution exactly, for
greedy and random requests alike, whatever a proposer returns - a bad proposer only costs
speed, never correctness.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from octavo.attention.base import AttentionBackend
from octavo.config.speculative import SpeculativeConfig
from octavo.models.base import CausalLM
from octavo.platforms import Platform
from octavo.worker.step_inputs import StepInputs


@dataclass
class ProposerContext:
    """What a proposer is built with: the target model and the worker's layout."""

    config: SpeculativeConfig
    target: CausalLM  # shares its embedding / LM head with EAGLE and Medusa heads
    attn_backend: type[AttentionBackend]
    device: torch.device
    dtype: torch.dtype
    block_size: int
    max_model_len: int
    max_num_reqs: int
    vocab_size: int
    # The worker's platform: heads built from the target's layer classes are specialised
    # with ``platform.prepare_model`` as the target was.
    platform: type[Platform]
    # The registered model architectures, for proposers that build a model of their own.
    architectures: Mapping[str, type[CausalLM]] = field(default_factory=dict)


@dataclass
class ProposeInputs:
    """One step, seen after sampling. Index ``i`` is the ``i``-th request of the step, in the
    order of the flattened batch (``step.rows[i]``)."""

    req_ids: list[str]
    rows: np.ndarray  # int64 [R]: each request's row of the persistent batch
    # The persistent batch's token array (a view, do not write): request i's tokens -
    # prompt + every accepted output, this step's included - are
    # token_ids[rows[i], :num_tokens[i]].
    token_ids: np.ndarray  # int64 [max_num_reqs, max_model_len]
    num_tokens: np.ndarray  # int64 [R]
    # Tokens accepted this step (accepted drafts + the bonus/recovered token); empty for a
    # request still prefilling its prompt in chunks.
    sampled_token_ids: list[list[int]]
    # Whether request i wants drafts: it sampled this step and its settings allow
    # speculation. A proposer returns [] for the others (it may still update its state
    # from them, e.g. a draft model's KV cache).
    wants_drafts: np.ndarray  # bool [R]
    # The step the target just computed: input ids (drafts included), positions and the
    # attention metadata with block tables and slot mapping. A draft model whose own KV
    # cache is laid out like the target's reuses the block tables.
    step: StepInputs
    # Per request, how many of the step's scheduled tokens were drafts (0 when none).
    num_draft_tokens: np.ndarray  # int64 [R]
    # Flat index (into the step's tokens) of each request's last accepted token: the
    # position whose hidden state predicted the request's newest sampled token.
    last_token_indices: torch.Tensor  # int64 [R]
    # The target's final hidden states for every token of the step [T, hidden]: after the
    # final norm, or (needs_prenorm_hidden_states) before it. None unless asked for.
    hidden_states: torch.Tensor | None = None
    prenorm_hidden_states: torch.Tensor | None = None
    # The target's hidden states entering each layer of ``Proposer.aux_hidden_state_layers``,
    # in layer order, each [T, hidden] (EAGLE-3's auxiliary hidden states). None unless asked.
    aux_hidden_states: list[torch.Tensor] | None = None
    # The persistent batch's block tables (a view, do not write): row r's blocks are
    # block_table[r]; they cover k lookahead slots past each sampling request's tokens.
    block_table: np.ndarray | None = None  # int32 [max_num_reqs, max_blocks_per_req]

    def accepted_step(self, block_size: int, device: torch.device) -> StepInputs:
        """The step's tokens as they turned out, as inputs of a proposer's own forward pass:
        per request, the scheduled tokens that were not drafts, the drafts it accepted and
        the token it sampled (``[last token, accepted drafts, bonus]`` for a verifying
        request; the chunk, plus the first output token when the prompt is done, for a
        prefill)."""
        assert self.step.metadata.query_start_loc_cpu is not None
        assert self.block_table is not None
        bounds = self.step.metadata.query_start_loc_cpu.numpy().astype(np.int64)
        first_positions = self.step.positions.cpu().numpy()[bounds[:-1]]
        num_sampled = np.array([len(s) for s in self.sampled_token_ids], dtype=np.int64)
        counts = np.diff(bounds) - self.num_draft_tokens + num_sampled
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        positions = np.repeat(first_positions, counts) + offsets
        token_rows = np.repeat(self.rows, counts)
        return StepInputs.for_tokens(self.token_ids[token_rows, positions], positions, counts,
                                     self.block_table[self.rows], block_size, device)


class Proposer(ABC):
    """Base class of proposers. Subclasses set the ClassVars that tell the runner what to
    keep, and implement :meth:`propose`."""

    name: ClassVar[str]
    # The runner passes the target's hidden states only to proposers that ask for them.
    needs_hidden_states: ClassVar[bool] = False
    needs_prenorm_hidden_states: ClassVar[bool] = False
    # Target layers whose input hidden states the runner keeps for ``propose`` (EAGLE-3 reads
    # three); a proposer sets it in ``__init__`` (its checkpoint names them). Empty: none.
    aux_hidden_state_layers: tuple[int, ...] = ()
    # Whether propose() can return the nodes of ``DraftTree.of(config)``
    # (octavo.spec_decode.tree) in its order instead of a chain; only such proposers accept
    # speculative_token_tree.
    supports_token_tree: ClassVar[bool] = False
    # Whether the method needs ``SpeculativeConfig.model`` (a draft model or head folder);
    # checked when the engine is built.
    requires_model: ClassVar[bool] = False

    def __init__(self, context: ProposerContext) -> None:
        self.context = context
        self.config = context.config
        self.num_speculative_tokens = context.config.num_speculative_tokens

    @abstractmethod
    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        """Up to ``num_speculative_tokens`` drafts per request of ``inputs`` (``[]`` for
        none), in the order of ``inputs.req_ids``; with a tree, up to its nodes, in order."""

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block costs this proposer (a draft model's own paged cache, laid
        out with the target's block ids), counted into the KV sizing. 0: no cache."""
        return 0

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the proposer's own cache for ``num_blocks`` blocks (no-op by default)."""
        del num_blocks  # a proposer without a cache has nothing to allocate
