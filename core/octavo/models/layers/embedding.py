"""Token embedding and LM head, split over the vocabulary across tensor-parallel ranks.

Each rank holds ``ceil(vocab_size / tp_size)`` consecutive rows; the last rank's rows past
the vocabulary are zero padding, so any vocabulary splits over any number of ranks. The
embedding looks up the ids in its range (zeros elsewhere) and sums across ranks; the LM head
computes logits for its range, gathers them and drops the padding's columns. The table
belongs to the layer's quantization method (``quant_method``), which a tied head shares.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from octavo.models.layers.parallel import all_gather_last_dim, all_reduce, resolve_tp
from octavo.models.layers.quantization import EmbeddingMethodBase, embedding_method
from octavo.models.layers.weights import check_shape


class VocabParallelEmbedding(nn.Module):
    """Token ids ``[T]`` -> embeddings ``[T, hidden]``; ``tie_to`` reuses another table's
    weight and method instead of allocating one (tied embeddings)."""

    weight: nn.Parameter

    def __init__(
        self, vocab_size: int, hidden_size: int, tp_rank: int | None = None,
        tp_size: int | None = None, tie_to: VocabParallelEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = resolve_tp(tp_rank, tp_size)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.quant_method: EmbeddingMethodBase
        if tie_to is None:
            self.quant_method = embedding_method(self)
            self.quant_method.create_weights(self, self.rows_per_rank, hidden_size,
                                             self.weight_loader)
        else:
            self.quant_method, self.weight = tie_to.quant_method, tie_to.weight

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        check_shape(loaded, (self.vocab_size, param.shape[1]))
        rows = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
        param.data[: len(rows)].copy_(rows)
        param.data[len(rows) :].zero_()  # padding past the vocabulary

    def dense_weight(self) -> torch.Tensor:
        """This rank's table in the model's dtype, however the method holds it (a quantized
        one dequantizes a copy)."""
        return self.quant_method.dense_weight(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.embed(self, input_ids)
        local_ids = input_ids - self.vocab_start
        mine = (local_ids >= 0) & (local_ids < self.rows_per_rank)
        embedded = self.quant_method.embed(self, local_ids * mine) * mine[:, None]
        return all_reduce(embedded)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to vocabulary logits; ``tie_to`` shares the embedding's weight
    (tied embeddings) instead of holding its own."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp_rank: int | None = None,
        tp_size: int | None = None, tie_to: VocabParallelEmbedding | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, tp_rank, tp_size, tie_to=tie_to)
        # A faster GEMM on a prepacked copy of the weight (or on its quantized blocks),
        # attached by the platform's prepare_model (the CPU's: octavo.cpu.gemm,
        # octavo.cpu.quant); None: the method's apply.
        self.cpu_gemm: Callable[[torch.Tensor], torch.Tensor] | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[N, vocab_size]`` for hidden states ``[N, hidden_size]``."""
        if self.cpu_gemm is not None:
            logits = self.cpu_gemm(hidden)
        else:
            logits = self.quant_method.apply(self, hidden)
        if self.tp_size > 1:
            logits = all_gather_last_dim(logits)[:, : self.vocab_size]
        return logits.float()
