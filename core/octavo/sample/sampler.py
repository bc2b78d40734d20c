"""The batched sampler: one token per row of logits, every row with its own settings.

Order, as in vLLM V1:
1. processors that must see raw logits: allowed_token_ids, logit_bias, bad_words, min_tokens;
2. repetition, frequency and presence penalties;
3. logprobs to return, taken here: log_softmax of the processed logits, before temperature
   and truncation. vLLM's default takes them from the raw logits; Octavo returns what the
   request's own settings make of the model's scores, so banned tokens show -inf;
4. greedy rows: argmax;
5. random rows: temperature, min-p, top-k, top-p, then one draw per row.

The draw inverts the row's cumulative distribution at one uniform number: the first token
whose cumulative probability passes ``u * total`` is token i with probability
``probs[i] / total``. It costs one pass of adds per row. The exponential race (argmax of
``probs / E``, ``E ~ Exp(1)`` per token) that GPU engines use needs one exponential draw
per vocabulary entry, about 20 ns each on a CPU: at 64 rows x 49k tokens that was 65 ms a
step, more than SmolLM2-135M's whole forward pass. Seeded rows take their uniform from
their own generator, so a seeded request draws the same tokens whatever else is in the
batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.sample.logprobs import LogprobsTensors, gather_logprobs
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.penalties import apply_penalties
from octavo.sample.processors import apply_logits_processors
from octavo.sample.topk_topp import apply_min_p, apply_top_k_top_p


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int64 [B]
    logprobs: LogprobsTensors | None  # None unless a row asked for logprobs


class Sampler(torch.nn.Module):
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """``logits`` [B, V] are left untouched; the sampler works on an fp32 copy, except
        for a greedy batch that nothing rewrites and that asks for no logprobs: its argmax
        reads the logits as given (the copy of 64 x 49,152 fp32 logits took 1.2 ms a step
        of W1, six times the argmax)."""
        if (metadata.all_greedy and metadata.max_num_logprobs is None
                and not metadata.edits_logits):
            return SamplerOutput(sampled_token_ids=greedy_argmax(logits), logprobs=None)
        logits = logits.to(torch.float32, copy=True)
        logits = apply_logits_processors(logits, metadata)
        logits = apply_penalties(logits, metadata)
        sampled = self.sample(logits, metadata)
        logprobs = None
        if metadata.max_num_logprobs is not None:
            logprobs = gather_logprobs(
                torch.log_softmax(logits, dim=-1), sampled, metadata.max_num_logprobs
            )
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        if metadata.all_greedy:
            return greedy_argmax(logits)
        is_greedy = metadata.temperature == 0
        drawn = draw_tokens(truncated_probs(logits, metadata), metadata.generators)
        if metadata.all_random:
            return drawn
        return torch.where(is_greedy, greedy_argmax(logits), drawn)


# Entries per block of greedy_argmax's first pass.
ARGMAX_BLOCK = 128


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` for fp32 rows ``[B, V]``, the same indices (the first of
    equal maxima; NaN counts as the largest): each block of ``ARGMAX_BLOCK`` entries' max,
    the first block holding the row's max, the first index of it there. PyTorch's CPU
    argmax walks the row one entry at a time (1.3 ms at 64 x 49,152, a step of W1), where
    its max reduction is vectorised (0.2 ms for these three passes)."""
    rows, vocab = logits.shape
    if vocab % ARGMAX_BLOCK or not logits.is_contiguous():
        return logits.argmax(dim=-1)
    blocks = logits.view(rows, vocab // ARGMAX_BLOCK, ARGMAX_BLOCK)
    block = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks[torch.arange(rows, device=logits.device), block].argmax(dim=-1)
    return block * ARGMAX_BLOCK + inner


def truncated_probs(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """What random rows draw from: temperature, min-p, top-k, top-p, softmax ([B, V]).
    Greedy rows in a mixed batch go through unscaled; callers replace them by the argmax.
    The rejection sampler verifies drafts against these same distributions."""
    temperature = torch.where(metadata.temperature == 0, 1.0, metadata.temperature)
    scaled = logits / temperature.unsqueeze(1)
    if metadata.min_p is not None:
        scaled = apply_min_p(scaled, metadata.min_p)
    scaled = apply_top_k_top_p(scaled, metadata.top_k, metadata.top_p)
    return scaled.softmax(dim=-1)


def draw_tokens(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (each row any nonnegative weights with a
    positive sum); rows in ``generators`` use their own."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # fp64: 49k fp32 adds would drift
    total = cdf[:, -1:]
    uniform = uniform_rows(torch.empty_like(total), generators)
    # Kept strictly below the total, so some entry of the cdf exceeds it and the first one
    # that does belongs to a token of nonzero probability.
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def uniform_rows(out: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Fill ``out`` [B, ...] with uniform draws in [0, 1); rows with a generator use their
    own."""
    if len(generators) < out.shape[0]:
        out.uniform_()
    for row, generator in generators.items():
        out[row].uniform_(generator=generator)
    return out
