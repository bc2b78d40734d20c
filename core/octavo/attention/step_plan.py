"""How one step's requests are attended, worked out once per step (``StepPlan``, kept in the
metadata's ``backend_state``) and shared by every layer and by the portable backends built
on it (``torch_backend``, ``torch_mla``, the CPU's): single-token requests (and a few tokens
over a cached context) as decode rows over a padded context, prompt chunks in groups of
consecutive requests with equal query and context lengths; and the masks they attend with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from octavo.attention.base import AttentionMetadata

# Requests with at most this many new tokens over a cached context attend as that many
# decode rows (the fused decode kernel reads the cache in place); longer ones as prefills.
DECODE_QUERY_LIMIT = 16


@dataclass
class DecodeBatch:
    """The single-token requests of a step, attended together over a padded context."""

    tokens: torch.Tensor | None  # int64 [B]: their query tokens; None: tokens 0..B-1
    slots: torch.Tensor  # int64 [B * max_len]: cache slot of each context position
    seq_lens: torch.Tensor  # int64 [B, 1]
    max_len: int
    equal_lens: bool  # every request has max_len tokens of context (no padding)


@dataclass
class PrefillGroup:
    """Consecutive requests with several query tokens and the same query and context
    lengths, attended in one call."""

    start: int  # first query token of the group in the flat batch
    num_reqs: int
    query_len: int
    seq_len: int
    slots: torch.Tensor | None  # int64 [num_reqs * seq_len]; None: fresh prompts


@dataclass
class StepPlan:
    """How one step's requests are attended; shared by every layer of the step."""

    decode: DecodeBatch | None
    prefills: list[PrefillGroup]
    block_size: int
    masks: dict[tuple, torch.Tensor | None] = field(default_factory=dict)  # per window
    # What a device subclass's fused kernels work out once per step (in the first layer).
    native: dict[str, Any] = field(default_factory=dict)


def build_plan(metadata: AttentionMetadata, block_size: int) -> StepPlan:
    num_reqs = metadata.num_reqs
    starts = _host(metadata.query_start_loc_cpu, metadata.query_start_loc)[
        :num_reqs + 1].tolist()
    seq_lens = _host(metadata.seq_lens_cpu, metadata.seq_lens)[:num_reqs].tolist()
    query_lens = [end - start for start, end in zip(starts, starts[1:])]
    block_tables = metadata.block_tables
    trees = metadata.token_trees
    tree_rows = trees.requests if trees else frozenset()
    as_decodes = [length == 1 or row in tree_rows
                  or (length <= DECODE_QUERY_LIMIT and seq_len > length)
                  for row, (length, seq_len) in enumerate(zip(query_lens, seq_lens))]
    decode = _decode_batch(starts, seq_lens, as_decodes, block_tables, block_size,
                           tree_rows, trees.ancestors.numpy() if trees else None)
    prefills: list[PrefillGroup] = []
    for row, length in enumerate(query_lens):
        if as_decodes[row]:
            continue
        last = prefills[-1] if prefills else None
        if (last is not None and last.start + last.num_reqs * last.query_len == starts[row]
                and (last.query_len, last.seq_len) == (length, seq_lens[row])):
            last.num_reqs += 1
        else:
            prefills.append(PrefillGroup(starts[row], 1, length, seq_lens[row], None))
    row_of_token = {start: row for row, start in enumerate(starts[:-1])}
    for group in prefills:
        if group.seq_len != group.query_len:  # a cached prefix: read the context from the cache
            first = row_of_token[group.start]
            group.slots = context_slots(block_tables[first:first + group.num_reqs],
                                        group.seq_len, block_size)
    return StepPlan(decode, prefills, block_size)


def step_plan(metadata: AttentionMetadata, block_size: int) -> StepPlan:
    """The step's plan, worked out by its first layer and kept in the metadata."""
    plan = metadata.backend_state.get("torch")
    if plan is None:
        plan = metadata.backend_state["torch"] = build_plan(metadata, block_size)
    return plan


def _decode_batch(starts: list[int], seq_lens: list[int], as_decodes: list[bool],
                  block_tables: torch.Tensor, block_size: int, tree_rows: frozenset[int],
                  ancestors: np.ndarray | None) -> DecodeBatch | None:
    """The decode rows of a step, in the flat batch's order: one per single-token request,
    and one per query token of a request verifying a token tree or with a few new tokens
    over a cached context (a speculative verification, the tail of a chunked prompt). Such
    a query sees the context before the request's new tokens and, among those, the ones
    before it - or in a token tree its ancestors - so it is a decode over that list of
    cache positions."""
    tokens: list[int] = []
    rows: list[int] = []  # request of each decode row
    key_lists: dict[int, np.ndarray] = {}  # decode row -> its positions, unless 0..s-1
    for row, (start, end) in enumerate(zip(starts, starts[1:])):
        if not as_decodes[row]:
            continue
        q_len, s_len = end - start, seq_lens[row]
        if q_len > 1:
            allowed = (ancestors[:q_len, :q_len] if row in tree_rows and ancestors is not None
                       else np.tri(q_len, dtype=bool))
            context = np.arange(s_len - q_len)
            for j in range(q_len):
                key_lists[len(rows) + j] = np.concatenate(
                    [context, s_len - q_len + np.flatnonzero(allowed[j])])
        tokens += range(start, end)
        rows += [row] * q_len
    if not rows:
        return None
    lens = np.array([len(key_lists[i]) if i in key_lists else seq_lens[r]
                     for i, r in enumerate(rows)], dtype=np.int64)
    max_len = int(lens.max())
    positions = np.minimum(np.arange(max_len)[None, :], lens[:, None] - 1)
    for i, keys in key_lists.items():
        positions[i, :len(keys)] = keys
    device = block_tables.device
    positions_t = torch.from_numpy(positions).to(device)
    blocks = block_tables[torch.tensor(rows, device=device)].gather(
        1, positions_t // block_size).long()
    return DecodeBatch(
        tokens=None if tokens == list(range(len(tokens))) and len(tokens) == starts[-1]
        else torch.tensor(tokens, device=device),
        slots=(blocks * block_size + positions_t % block_size).flatten(),
        seq_lens=torch.from_numpy(lens).to(device)[:, None],
        max_len=max_len,
        equal_lens=bool(lens.min() == max_len),
    )


def context_slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions ``0..length-1`` of each row's context, flattened
    ``[rows * length]``."""
    positions = torch.arange(length, device=block_tables.device).expand(len(block_tables), -1)
    blocks = block_tables.gather(1, positions // block_size).long()
    return (blocks * block_size + positions % block_size).flatten()


def prefill_mask(query_len: int, seq_len: int, device: torch.device, plan: StepPlan,
                 window: int | None = None) -> torch.Tensor | None:
    """``[q, s]`` True where a query may attend a key (its causal context, within
    ``window``); None when plain causal does. Kept in the plan for the step's other layers."""
    if query_len == seq_len and (window is None or window >= seq_len):
        return None
    cache_key = ("prefill", query_len, seq_len, window)
    if cache_key not in plan.masks:
        query_pos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
        key_pos = torch.arange(seq_len, device=device)[None, :]
        allowed = key_pos <= query_pos
        if window is not None:
            allowed &= key_pos > query_pos - window
        plan.masks[cache_key] = allowed
    return plan.masks[cache_key]


def decode_mask(decode: DecodeBatch, plan: StepPlan, window: int | None = None,
                ) -> torch.Tensor | None:
    """``[B, 1, 1, max_len]``: each decode row's own context (and window); None when every
    row sees its whole padded context."""
    if decode.equal_lens and (window is None or window >= decode.max_len):
        return None
    cache_key = ("decode", window)
    if cache_key not in plan.masks:
        key_pos = torch.arange(decode.max_len, device=decode.seq_lens.device)[None, :]
        allowed = key_pos < decode.seq_lens
        if window is not None:
            allowed &= key_pos >= decode.seq_lens - window
        plan.masks[cache_key] = allowed[:, None, None, :]
    return plan.masks[cache_key]


def _host(host_copy: torch.Tensor | None, device_tensor: torch.Tensor) -> torch.Tensor:
    return device_tensor.cpu() if host_copy is None else host_copy
