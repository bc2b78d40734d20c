"""The persistent input batch: per-request state the model runner keeps between steps.

Each request the workers hold owns one row of preallocated numpy arrays (its token ids,
computed-token count, block table, sampling settings). Rows are written when a request
arrives, appended to as it samples tokens, and compacted when requests leave - never
rebuilt from Python lists each step, which is what keeps step preparation cheap with
hundreds of running requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from octavo.lora_request import LoRAAdapterRef
from octavo.outputs import NewRequestData, SchedulerOutput
from octavo.sample.metadata import SamplingArrays, make_generator
from octavo.sampling_params import SamplingParams, SamplingType


@dataclass
class CachedRequestState:
    """What the runner remembers of one request beyond its row (Python objects)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]
    generator: torch.Generator | None
    block_ids: list[int] = field(default_factory=list)
    # Every KV group's block table when the model has several (``NewRequestData``).
    group_block_ids: list[list[int]] = field(default_factory=list)
    # [num_prompt_tokens, hidden] in the model's dtype, on the device: the model's input at
    # the prompt positions (whose ids are placeholders) for a prompt given as embeddings.
    prompt_embeds: torch.Tensor | None = None
    # Its slot of the SSM layers' per-request state (-1: the model has none).
    state_slot: int = -1
    lora: LoRAAdapterRef | None = None  # its LoRA adapter (None: the base model)


class InputBatch:
    """Rows ``[0, num_reqs)`` hold the live requests, densely packed."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int,
                 num_kv_groups: int = 1) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.req_ids: list[str] = []
        self.req_index: dict[str, int] = {}
        self.states: dict[str, CachedRequestState] = {}
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        # One block table per KV group, all of one length per row (``num_blocks``): a
        # group's table is indexed by position // block_size like any other.
        self.block_tables = [np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
                             for _ in range(num_kv_groups)]
        self.block_table = self.block_tables[0]
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        # Rows whose prompt is embeddings (``CachedRequestState.prompt_embeds``): a step
        # without any scheduled skips them at the cost of one check.
        self.has_prompt_embeds = np.zeros(max_num_reqs, dtype=bool)
        self.state_slot = np.full(max_num_reqs, -1, dtype=np.int64)
        self.sampling = SamplingArrays.empty(max_num_reqs)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def apply(self, so: SchedulerOutput,
              make_state: Callable[[NewRequestData], CachedRequestState],
              reads_sampled_tokens: bool = False) -> None:
        """Bring the rows up to date with one step's ``SchedulerOutput``, before the step
        runs: finished requests leave; new ones arrive (``make_state`` turns each into the
        runner's state: its generator, its prompt embeddings on the device); a request
        resumed after preemption starts afresh from its ``NewRequestData``; running ones
        get their new blocks and computed-token counts. ``reads_sampled_tokens``: a
        pipeline stage before the last, which did not sample the tokens it is now given.

        The rows come out the same on every worker given the same outputs: a step's tokens
        are flattened in row order, and tensor ranks sum their partial results token by
        token (pipeline stages pass them on), so two ranks with different layouts would
        mix up requests. Hence the finished requests leave in sorted order - a set's order
        follows its strings' hashes, which each process salts differently."""
        for req_id in sorted(so.finished_req_ids):
            if req_id in self.req_index:
                self.remove(req_id)
        for new in so.scheduled_new_reqs:
            if new.req_id in self.req_index:  # resumed after preemption: start afresh
                self.remove(new.req_id)
            self.add(make_state(new), new.num_computed_tokens)
        for req_id, num_blocks in so.trimmed_block_tables.items():
            if req_id in self.req_index:  # its rejected drafts' blocks were released
                self.num_blocks[self.req_index[req_id]] = num_blocks
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            row = self.req_index[req_id]
            if cached.new_group_block_ids:
                self.append_group_blocks(row, cached.new_group_block_ids[i])
            else:
                self.append_blocks(row, cached.new_block_ids[i])
            self.num_computed_tokens[row] = cached.num_computed_tokens[i]
            if reads_sampled_tokens:
                self.place_sampled(row, cached.num_computed_tokens[i], cached.new_token_ids[i])

    def place_sampled(self, row: int, num_computed: int, token_ids: list[int]) -> None:
        """Put the output tokens of this step's positions (from ``max(num_computed, prompt
        length)`` on) in the row: appended when new, already there when a request resumed
        after preemption recomputes outputs it was given again in its ``NewRequestData``."""
        position = max(num_computed, int(self.num_prompt_tokens[row]))
        for token in token_ids:
            if position == self.num_tokens[row]:
                self.append_token(row, token)
            else:
                assert position < self.num_tokens[row], "a gap in the sampled tokens"
                assert self.token_ids[row, position] == token, "a sampled token changed"
            position += 1

    def add(self, state: CachedRequestState, num_computed_tokens: int) -> None:
        row = self.num_reqs
        if row >= self.max_num_reqs:
            raise RuntimeError(f"input batch is full ({self.max_num_reqs} requests)")
        tokens = state.prompt_token_ids + state.output_token_ids
        if len(tokens) > self.max_model_len:
            raise ValueError(f"request {state.req_id} has {len(tokens)} tokens, more than "
                             f"max_model_len={self.max_model_len}")
        self.req_ids.append(state.req_id)
        self.req_index[state.req_id] = row
        self.states[state.req_id] = state
        self.token_ids[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_prompt_tokens[row] = len(state.prompt_token_ids)
        self.num_computed_tokens[row] = num_computed_tokens
        self.has_prompt_embeds[row] = state.prompt_embeds is not None
        self.state_slot[row] = state.state_slot
        self.num_blocks[row] = 0
        if state.group_block_ids:
            self.append_group_blocks(row, state.group_block_ids)
        else:
            self.append_blocks(row, state.block_ids)
        self.sampling.set_row(row, state.sampling_params)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def append_group_blocks(self, row: int, group_block_ids: list[list[int]]) -> None:
        """Append each KV group's new blocks (equally many per group) to its table."""
        start = int(self.num_blocks[row])
        for table, block_ids in zip(self.block_tables, group_block_ids, strict=True):
            table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(group_block_ids[0])

    def append_token(self, row: int, token_id: int) -> None:
        self.token_ids[row, self.num_tokens[row]] = token_id
        self.num_tokens[row] += 1
        self.states[self.req_ids[row]].output_token_ids.append(token_id)

    def remove(self, req_id: str) -> None:
        """Drop a request and fill its row with the last one, keeping rows dense."""
        row = self.req_index.pop(req_id)
        del self.states[req_id]
        last = self.num_reqs - 1
        if row != last:
            self._move_row(last, row)
        self.req_ids.pop()

    def _move_row(self, src: int, dst: int) -> None:
        req_id = self.req_ids[src]
        self.req_ids[dst] = req_id
        self.req_index[req_id] = dst
        n = int(self.num_tokens[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        nb = int(self.num_blocks[src])
        for table in self.block_tables:
            table[dst, :nb] = table[src, :nb]
        for array in (self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens,
                      self.num_blocks, self.has_prompt_embeds, self.state_slot):
            array[dst] = array[src]
        self.sampling.copy_row(src, dst)


def new_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A seeded request's own generator, kept for its whole life (see make_generator)."""
    if params.sampling_type != SamplingType.RANDOM_SEED:
        return None
    assert params.seed is not None
    return make_generator(params.seed, device)
