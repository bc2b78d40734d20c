"""Token embedding and LM head, split over the vocabulary across tensor-parallel ranks.

Each rank holds ``ceil(vocab_size / tp_size)`` consecutive rows; the last rank's rows past
the vocabulary are zero padding, so any vocabulary splits over any number of ranks. The
embedding looks up the ids in its range (zeros elsewhere) and sums across ranks; the LM head
computes logits for its range, gathers them and drops the padding's columns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers.parallel import all_gather_last_dim, all_reduce, resolve_tp
from octavo.models.layers.weights import check_shape, new_parameter


class VocabParallelEmbedding(nn.Module):
    """Token ids ``[T]`` -> embeddings ``[T, hidden]``; ``weight`` reuses an existing
    parameter instead of allocating one (tied embeddings)."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp_rank: int | None = None,
        tp_size: int | None = None, weight: nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = resolve_tp(tp_rank, tp_size)
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        if weight is None:
            weight = new_parameter(self.rows_per_rank, hidden_size,
                                   weight_loader=self.weight_loader)
        self.weight = weight

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        check_shape(loaded, (self.vocab_size, param.shape[1]))
        rows = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
        param.data[: len(rows)].copy_(rows)
        param.data[len(rows) :].zero_()  # padding past the vocabulary

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local_ids = input_ids - self.vocab_start
        mine = (local_ids >= 0) & (local_ids < self.rows_per_rank)
        embedded = F.embedding(local_ids * mine, self.weight) * mine[:, None]
        return all_reduce(embedded)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to vocabulary logits; ``tie_to`` shares the embedding's weight
    (tied embeddings) instead of holding its own."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp_rank: int | None = None,
        tp_size: int | None = None, tie_to: VocabParallelEmbedding | None = None,
    ) -> None:
        tied = None if tie_to is None else tie_to.weight
        super().__init__(vocab_size, hidden_size, tp_rank, tp_size, weight=tied)
        # A faster GEMM on a prepacked copy of the weight, attached by the platform's
        # prepare_model (the CPU's: octavo.cpu.gemm); None: F.linear.
        self.cpu_gemm: Callable[[torch.Tensor], torch.Tensor] | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[N, vocab_size]`` for hidden states ``[N, hidden_size]``."""
        if self.cpu_gemm is not None:
            logits = self.cpu_gemm(hidden)
        else:
            logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = all_gather_last_dim(logits)[:, : self.vocab_size]
        return logits.float()
