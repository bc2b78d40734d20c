"""The roofline of one decode step: bytes it must read and FLOPs it must do, from the
model's own shapes, against the machine's measured peaks.

At batch size B (each sequence ``context_len`` tokens long) one decode step reads every
weight once - shared by the whole batch - plus each sequence's KV cache, and does two FLOPs
per weight per sequence plus the attention over the context:

    bytes(B) = W + B x KV(ctx)            W: weight bytes; KV: one sequence's cache
    flops(B) = B x (2 x P + A(ctx))       P: matmul weights; A: attention FLOPs

The step cannot be faster than either the time to move those bytes at the machine's
bandwidth or the time to do those FLOPs at its peak: ``predicted = max(bytes / BW,
flops / PEAK)``. At small B the memory term wins (the weights dominate and do not grow
with B); at ``B_sat``, where the two terms meet, the step turns compute-bound, and beyond
it the time grows with B and the throughput stops growing.

Counted as read per step: every matmul weight, the norms, and the LM head (the embedding
table when it is tied, as in SmolLM2: the LM head reads all of it); an untied input
embedding only gives its B looked-up rows, which are left out. The KV written per step
(one token per sequence) is negligible and left out too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(num_layers=int(config["num_hidden_layers"]), hidden_size=hidden,
                   num_heads=heads,
                   num_kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate_size=int(config["intermediate_size"]),
                   vocab_size=int(config["vocab_size"]),
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)))

    @property
    def layer_matmul_params(self) -> int:
        """q, k, v, o and the gated MLP's three projections of one layer."""
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """Every weight a token multiplies: the layers' and the LM head's."""
        return self.num_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

    @property
    def streamed_params(self) -> int:
        """Every weight one step reads: the matmuls and the norms (two per layer, a final)."""
        return self.matmul_params + (2 * self.num_layers + 1) * self.hidden_size

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes

    def attention_flops(self, context_len: int) -> int:
        """Q.K^T and the weighted sum over V, for one new token over ``context_len``."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * context_len


@dataclass(frozen=True)
class Peaks:
    """The machine's measured ceilings."""

    flops_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class StepCost:
    bytes: int
    flops: int


def decode_step_cost(shape: ModelShape, batch_size: int, context_len: int,
                     weight_bytes: float = 2, kv_bytes: int = 2) -> StepCost:
    """What one decode step of ``batch_size`` sequences at ``context_len`` must move and do
    (``weight_bytes``, ``kv_bytes``: bytes per element, 2 for bf16; a quantized model's
    weights as held, e.g. 0.625 for Q4_1's 20-byte blocks of 32)."""
    weights = round(shape.streamed_params * weight_bytes)
    kv = batch_size * context_len * shape.kv_bytes_per_token(kv_bytes)
    flops = batch_size * (2 * shape.matmul_params + shape.attention_flops(context_len))
    return StepCost(bytes=weights + kv, flops=flops)


@dataclass(frozen=True)
class Prediction:
    memory_s: float  # the bytes at the measured bandwidth
    compute_s: float  # the FLOPs at the measured peak

    @property
    def step_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def predict(cost: StepCost, peaks: Peaks) -> Prediction:
    return Prediction(cost.bytes / peaks.bytes_per_s, cost.flops / peaks.flops_per_s)


def saturation_batch(shape: ModelShape, peaks: Peaks, context_len: int,
                     weight_bytes: float = 2, kv_bytes: int = 2) -> float:
    """``B_sat``: the batch size where the compute time reaches the memory time (a real
    number; ``inf`` when the KV cache alone keeps every batch memory-bound)."""
    base = decode_step_cost(shape, 0, context_len, weight_bytes, kv_bytes)
    one = decode_step_cost(shape, 1, context_len, weight_bytes, kv_bytes)
    per_seq_bytes, per_seq_flops = one.bytes - base.bytes, one.flops
    # B * flops1 / PEAK = (W + B * kv1) / BW  =>  B = W / (flops1 * BW / PEAK - kv1)
    margin = per_seq_flops * peaks.bytes_per_s / peaks.flops_per_s - per_seq_bytes
    return base.bytes / margin if margin > 0 else math.inf
