"""Ulysses sequence parallelism (SP): the token split and the two all-to-alls of attention.

Every rank of a sequence group runs the same step (the same scheduler output, metadata and
sampling) but computes only its slice of the step's tokens through the embedding, the
norms, the MLPs and the projections: the ``T`` tokens are padded with zeros to a multiple
of the group size ``S`` and rank ``r`` takes rows ``[r * T_pad / S, (r + 1) * T_pad / S)``
(``shard_tokens``). Attention needs every token of a request, so around it an all-to-all
trades tokens for heads (``tokens_to_heads``): each rank sends head group ``j`` of its
tokens' q/k/v to rank ``j`` and receives every rank's tokens for its own head group, drops
the padding and attends over all ``T`` tokens with ``heads / S`` query and key/value heads,
writing those key/value heads into its own KV cache. A second all-to-all
(``heads_to_tokens``) hands the attention output back to the ranks that own the tokens,
for the output projection. At the end of the decoder stack the ranks all-gather their
hidden states (``gather_tokens``), so every rank holds the whole step's ``[T, hidden]``
and computes the logits and samples as one rank would.

Decode steps take the same path: a batch of decode tokens is split (and padded) like a
prompt chunk, so there is one code path for every step.

The group's collectives are torch.distributed's (``all_to_all_single``, ``all_gather``):
gloo on the CPU, NCCL on GPUs. With one sequence rank every function here returns its
input untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.distributed.state import get_parallel_state


def sp_size() -> int:
    """This process's sequence-parallel group size (1: no sequence parallelism)."""
    return get_parallel_state().info.sp_size


def padded_tokens(num_tokens: int, size: int) -> int:
    """``num_tokens`` rounded up to a multiple of ``size``."""
    return -(-num_tokens // size) * size


def shard_tokens(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's rows of ``tensor`` (``[T, ...]``), zero-padded to a multiple of the
    group size first."""
    info = get_parallel_state().info
    if info.sp_size == 1:
        return tensor
    num_tokens = tensor.shape[0]
    padding = padded_tokens(num_tokens, info.sp_size) - num_tokens
    if padding:
        tensor = torch.cat([tensor, tensor.new_zeros((padding, *tensor.shape[1:]))])
    return tensor.chunk(info.sp_size)[info.sp_rank]


def gather_tokens(local: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Every rank's ``local`` rows in rank order, without the padding: ``[num_tokens, ...]``."""
    state = get_parallel_state()
    if state.sp is None:
        return local
    return state.sp.all_gather(local, 0)[:num_tokens]


def tokens_to_heads(parts: list[torch.Tensor], num_tokens: int) -> list[torch.Tensor]:
    """The first all-to-all: ``parts`` (q, k, v: ``[T_local, heads, head_dim]`` each, this
    rank's tokens and all its heads) become ``[num_tokens, heads / S, head_dim]`` (every
    token, this rank's head group), in one collective for all of them."""
    state = get_parallel_state()
    if state.sp is None:
        return parts
    size, local = state.info.sp_size, parts[0].shape[0]
    groups = [part.view(local, size, part.shape[1] // size, part.shape[2]) for part in parts]
    # [S, T_local, heads of all parts / S, head_dim]: chunk j, head group j, goes to rank j.
    sent = torch.cat(groups, dim=2).transpose(0, 1)
    received = state.sp.all_to_all(sent).flatten(0, 1)[:num_tokens]
    return list(received.split([group.shape[2] for group in groups], dim=1))


def heads_to_tokens(out: torch.Tensor, num_local: int) -> torch.Tensor:
    """The second all-to-all: attention's ``out`` (``[T, heads / S, head_dim]``, every
    token of this rank's head group) becomes ``[num_local, heads, head_dim]`` (this rank's
    tokens, every head)."""
    state = get_parallel_state()
    if state.sp is None:
        return out
    size = state.info.sp_size
    out = F.pad(out, (0, 0, 0, 0, 0, num_local * size - out.shape[0]))
    received = state.sp.all_to_all(out.view(size, num_local, *out.shape[1:]))
    # [S (head group), T_local, heads / S, head_dim] -> [T_local, heads, head_dim]
    return received.transpose(0, 1).flatten(1, 2)
