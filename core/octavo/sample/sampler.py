"""The batched sampler: one token per row of logits, every row with its own settings.

Order, as in vLLM V1:
1. processors that must see raw logits: allowed_token_ids, logit_bias, bad_words, min_tokens;
2. repetition, frequency and presence penalties;
3. logprobs to return, taken here: log_softmax of the processed logits, before temperature
   and truncation. vLLM's default takes them from the raw logits; Octavo returns what the
   request's own settings make of the model's scores, so banned tokens show -inf;
4. greedy rows: argmax;
5. random rows: temperature, min-p, top-k, top-p, then one draw per row.

The draw is an exponential race: argmax of ``probs / E`` with ``E ~ Exp(1)`` per token picks
token i with probability ``probs[i]``. Seeded rows take their ``E`` from their own
generator, so a seeded request draws the same tokens whatever else is in the batch.
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
        """``logits`` [B, V] are left untouched; the sampler works on an fp32 copy."""
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
            return logits.argmax(dim=-1)
        is_greedy = metadata.temperature == 0
        drawn = exponential_race(truncated_probs(logits, metadata), metadata.generators)
        if metadata.all_random:
            return drawn
        return torch.where(is_greedy, logits.argmax(dim=-1), drawn)


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


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` [B, V]; rows in ``generators`` use their own."""
    noise = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        noise.exponential_()
    for row, generator in generators.items():
        noise[row].exponential_(generator=generator)
    # A zero draw would turn a zero probability into 0/0 = nan, which argmax would pick.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return probs.div_(noise).argmax(dim=-1)
