"""Logits processors that act on the raw logits, before penalties and temperature:
allowed_token_ids, logit_bias, bad_words and min_tokens (as in vLLM V1).

Each works in place on ``logits`` [B, V] and touches only the rows that use it. The
per-request settings are sparse (a few token ids per row), so they are gathered into index
lists in Python and applied with one indexed write each.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from octavo.sample.metadata import SamplingMetadata


def apply_logits_processors(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    if metadata.allowed_token_ids_mask is not None:
        logits.masked_fill_(~metadata.allowed_token_ids_mask, float("-inf"))
    _apply_logit_bias(logits, metadata.logit_bias)
    _ban(logits, _bad_word_bans(metadata.bad_words_token_ids, metadata.output_token_ids))
    _ban(logits, _min_tokens_bans(metadata.min_tokens, metadata.output_token_ids))
    return logits


def _apply_logit_bias(logits: torch.Tensor, logit_bias: list[dict[int, float] | None]) -> None:
    rows: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    for row, bias in enumerate(logit_bias):
        if bias:
            rows.extend([row] * len(bias))
            token_ids.extend(bias)
            values.extend(bias.values())
    if rows:
        index = (_index(rows, logits), _index(token_ids, logits))
        logits.index_put_(index, torch.tensor(values, device=logits.device), accumulate=True)


def _bad_word_bans(
    bad_words: list[list[list[int]]], output_token_ids: list[list[int]]
) -> list[tuple[int, int]]:
    """A bad word's last token is banned when the row's output ends with the rest of it
    (a one-token bad word is always banned)."""
    bans = []
    for row, sequences in enumerate(bad_words):
        output = output_token_ids[row]
        for *prefix, last in sequences:
            if len(prefix) <= len(output) and output[len(output) - len(prefix):] == prefix:
                bans.append((row, last))
    return bans


def _min_tokens_bans(
    min_tokens: dict[int, tuple[int, frozenset[int]]], output_token_ids: list[list[int]]
) -> list[tuple[int, int]]:
    """Stop and EOS tokens are banned while a row has fewer than min_tokens outputs."""
    return [
        (row, token_id)
        for row, (minimum, stop_ids) in min_tokens.items()
        if len(output_token_ids[row]) < minimum
        for token_id in stop_ids
    ]


def _ban(logits: torch.Tensor, bans: list[tuple[int, int]]) -> None:
    if bans:
        rows, token_ids = zip(*bans, strict=True)
        logits[_index(rows, logits), _index(token_ids, logits)] = float("-inf")


def _index(values: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=logits.device)
