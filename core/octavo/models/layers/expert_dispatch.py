"""Expert parallelism across data-parallel engines: all-to-all dispatch and combine.

With ``-dp N --enable-expert-parallel`` every worker of every engine is one rank of the
expert group (``octavo.distributed.engine_group.ExpertGroup``) and holds
``num_experts / group size`` whole experts. Attention is data-parallel (each engine its own
requests), so each rank sees only its own tokens, and a MoE layer moves them:

1. route: each (token, slot) pair goes to the rank holding its expert
   (``expert // experts_per_rank``); the pairs are sorted by that rank;
2. counts: a small all-to-all of ``[group size]`` int64 tells each rank how many rows it
   will receive from each. Counts are exchanged rather than padded: a padded all-to-all
   must send every rank the worst case (all of a step's tokens times top-k), which at
   8 experts / top-2 over 2 ranks is about twice the rows actually routed, per layer; the
   exchange costs one tiny collective;
3. dispatch: an all-to-all of the pairs' hidden rows, and one of their expert ids;
4. the receiving rank sorts its rows by local expert and runs them with the grouped
   expert kernel (``octavo.models.layers.moe.expert_kernel``);
5. combine: an all-to-all sends each result back to the rank its token came from, which
   weights it by its routing weight and sums each token's top-k results.

The routing weights never travel: they stay with the token's rank, which applies them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from octavo.distributed.engine_group import ExpertGroup

# (rows [N, H] sorted by local expert, rows per local expert [E_local]) -> outputs [N, H]
RunExperts = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def dispatch_and_combine(x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor,
                         group: ExpertGroup, experts_per_rank: int,
                         run_experts: RunExperts) -> torch.Tensor:
    """This rank's tokens ``x [T, H]`` (routing ``weights``/``expert_ids [T, k]``) through
    their experts, wherever they live -> ``[T, H]``. Every rank of ``group`` calls it
    together, with its own tokens (none: ``T = 0``, e.g. an engine's dummy batch)."""
    top_k = expert_ids.shape[1]
    flat_ids = expert_ids.flatten()
    destination = torch.div(flat_ids, experts_per_rank, rounding_mode="floor")
    order = torch.argsort(destination, stable=True)
    send = torch.bincount(destination, minlength=group.size).to(torch.int64)
    recv_counts = group.exchange_counts(send).tolist()
    send_counts = send.tolist()
    tokens = torch.div(order, top_k, rounding_mode="floor")
    rows = group.all_to_all(x[tokens], send_counts, recv_counts)
    ids = group.all_to_all(flat_ids[order], send_counts, recv_counts)
    results = _run_received(rows, ids - group.rank * experts_per_rank, experts_per_rank,
                            run_experts)
    returned = group.all_to_all(results, recv_counts, send_counts)
    weighted = (returned * weights.flatten()[order][:, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, weighted)


def _run_received(rows: torch.Tensor, local_ids: torch.Tensor, experts_per_rank: int,
                  run_experts: RunExperts) -> torch.Tensor:
    """The received rows through this rank's experts, in the order they arrived."""
    if not len(rows):
        return rows
    by_expert = torch.argsort(local_ids, stable=True)
    counts = torch.bincount(local_ids, minlength=experts_per_rank)
    results = torch.empty_like(rows)
    results[by_expert] = run_experts(rows[by_expert], counts).to(rows.dtype)
    return results


def token_share(num_tokens: int, tp_rank: int, tp_size: int) -> slice:
    """The rows of a step's tokens that tensor rank ``tp_rank`` dispatches: every tensor
    rank of an engine holds all of them, so each sends an even share (no expert runs a
    token twice) and the engine's ranks all-reduce the shares back together."""
    per_rank = -(-num_tokens // tp_size)
    return slice(min(tp_rank * per_rank, num_tokens), min((tp_rank + 1) * per_rank, num_tokens))
