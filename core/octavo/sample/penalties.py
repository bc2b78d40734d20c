"""Repetition, frequency and presence penalties, vectorised over the batch.

Repetition penalty (CTRL / HF semantics): a token seen in the prompt or the output has a
positive logit divided by the penalty and a negative one multiplied by it. Frequency and
presence penalties (OpenAI semantics) look only at the output: subtract
``frequency * count`` and ``presence * (count > 0)``.
"""

from __future__ import annotations

import torch

from octavo.sample.metadata import SamplingMetadata, padded_token_ids


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    repetition = metadata.repetition_penalties
    frequency = metadata.frequency_penalties
    presence = metadata.presence_penalties
    if repetition is None or frequency is None or presence is None:
        return logits
    if metadata.prompt_token_ids is None:
        raise ValueError("SamplingMetadata has penalties but no prompt_token_ids")
    vocab_size = logits.shape[1]
    outputs = padded_token_ids(metadata.output_token_ids, vocab_size, logits.device)
    output_counts = _token_counts(outputs, vocab_size)
    seen = (_token_counts(metadata.prompt_token_ids, vocab_size) > 0) | (output_counts > 0)

    factor = torch.where(seen, repetition.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / factor, logits * factor)
    logits -= frequency.unsqueeze(1) * output_counts
    logits -= presence.unsqueeze(1) * (output_counts > 0)
    return logits


def _token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each token occurs per row of ``token_ids`` [B, L] padded with
    ``vocab_size`` -> float32 [B, V]; the padding lands in an extra bin that is dropped."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=counts.dtype))
    return counts[:, :vocab_size]
