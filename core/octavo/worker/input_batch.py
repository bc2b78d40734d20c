"""The persistent input batch: per-request state the model runner keeps between steps.

Each request the workers hold owns one row of preallocated numpy arrays (its token ids,
computed-token count, block table, sampling settings). Rows are written when a request
arrives, appended to as it samples tokens, and compacted when requests leave - never
rebuilt from Python lists each step, which is what keeps step preparation cheap with
hundreds of running requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

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


class InputBatch:
    """Rows ``[0, num_reqs)`` hold the live requests, densely packed."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.req_ids: list[str] = []
        self.req_index: dict[str, int] = {}
        self.states: dict[str, CachedRequestState] = {}
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.sampling = SamplingArrays.empty(max_num_reqs)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

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
        self.num_blocks[row] = 0
        self.append_blocks(row, state.block_ids)
        self.sampling.set_row(row, state.sampling_params)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

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
        self.block_table[dst, :nb] = self.block_table[src, :nb]
        for array in (self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens,
                      self.num_blocks):
            array[dst] = array[src]
        self.sampling.copy_row(src, dst)


def new_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A seeded request's own generator, kept for its whole life (see make_generator)."""
    if params.sampling_type != SamplingType.RANDOM_SEED:
        return None
    assert params.seed is not None
    return make_generator(params.seed, device)
