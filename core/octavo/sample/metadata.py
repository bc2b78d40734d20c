"""``SamplingMetadata``: the sampling settings of one batch, one row per request, as tensors.

The model runner keeps per-request state between steps, so the metadata is built in two
layers: ``SamplingArrays`` holds the numeric settings as numpy columns that the runner
rewrites only for requests that were added or moved, and ``SamplingMetadata.from_arrays``
turns a slice of them into tensors each step. ``SamplingMetadata.from_params`` does both
from a plain list of ``SamplingParams`` (tests, one-off batches).

Every optional tensor is ``None`` when no row uses that feature, so the sampler skips the
work entirely; ``all_greedy`` lets an all-greedy batch skip every random step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from octavo.sampling_params import _GREEDY_EPS, SamplingParams, SamplingType


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The per-request generator of a seeded request. Keep it for the request's lifetime:
    re-seeding every step would repeat the same draws."""
    return torch.Generator(device=device).manual_seed(seed)


def padded_token_ids(
    rows: Sequence[Sequence[int]], pad: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Ragged token-id lists as one int64 tensor [len(rows), longest], padded with ``pad``
    (the vocabulary size, so counting can drop the pad as an extra bin)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=lengths.sum())
    out = np.full((len(rows), int(lengths.max(initial=0))), pad, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = flat
    return torch.from_numpy(out).to(device)


@dataclass
class SamplingArrays:
    """Numeric per-row settings as numpy columns, in the encoding the sampler uses:
    temperature 0 marks a greedy row, top_k 0 / top_p 1 / min_p 0 and neutral penalties
    mean "off"."""

    temperature: np.ndarray  # float32
    top_k: np.ndarray  # int64
    top_p: np.ndarray  # float32
    min_p: np.ndarray  # float32
    presence_penalty: np.ndarray  # float32
    frequency_penalty: np.ndarray  # float32
    repetition_penalty: np.ndarray  # float32

    @classmethod
    def empty(cls, max_rows: int) -> SamplingArrays:
        """Rows start as neutral greedy settings until ``set_row`` writes them."""
        columns = {f.name: np.zeros(max_rows, dtype=np.float32) for f in fields(cls)}
        columns["top_k"] = np.zeros(max_rows, dtype=np.int64)
        columns["top_p"][:] = 1.0
        columns["repetition_penalty"][:] = 1.0
        return cls(**columns)

    def set_row(self, row: int, params: SamplingParams) -> None:
        greedy = params.sampling_type == SamplingType.GREEDY
        self.temperature[row] = 0.0 if greedy else params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p
        self.min_p[row] = params.min_p
        self.presence_penalty[row] = params.presence_penalty
        self.frequency_penalty[row] = params.frequency_penalty
        self.repetition_penalty[row] = params.repetition_penalty

    def copy_row(self, src: int, dst: int) -> None:
        """Move a request's settings when the runner compacts its batch."""
        for f in fields(self):
            column = getattr(self, f.name)
            column[dst] = column[src]


@dataclass
class SamplingMetadata:
    """One batch's sampling settings; tensors live on the logits' device, one row per
    request. Lists are read when the sampler runs, so the runner may append sampled tokens
    to ``output_token_ids`` in place between steps."""

    temperature: torch.Tensor  # [B] float32; 0 => greedy row
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None  # [B] int64, vocab size where off; None when off everywhere
    top_p: torch.Tensor | None  # [B] float32
    min_p: torch.Tensor | None  # [B] float32
    generators: dict[int, torch.Generator]  # row -> generator of a seeded random row
    # The three penalties are all present or all None (no row uses any penalty).
    presence_penalties: torch.Tensor | None  # [B] float32
    frequency_penalties: torch.Tensor | None  # [B] float32
    repetition_penalties: torch.Tensor | None  # [B] float32
    prompt_token_ids: torch.Tensor | None  # [B, Lp] int64 padded with vocab size
    output_token_ids: list[list[int]]  # per row, tokens generated so far
    logit_bias: list[dict[int, float] | None]
    allowed_token_ids_mask: torch.Tensor | None  # [B, V] bool, True = allowed
    bad_words_token_ids: list[list[list[int]]]  # per row, token sequences to ban
    # row -> (min_tokens, ids to suppress until the row has that many output tokens)
    min_tokens: dict[int, tuple[int, frozenset[int]]]
    max_num_logprobs: int | None  # top-n logprobs to return; None: no logprobs

    @property
    def edits_logits(self) -> bool:
        """Whether a processor or a penalty may rewrite some row's logits (the sampler's
        steps 1 and 2); else a batch of greedy rows is the argmax of the logits as given."""
        return (self.allowed_token_ids_mask is not None or self.repetition_penalties is not None
                or bool(self.min_tokens) or any(self.logit_bias)
                or any(self.bad_words_token_ids))

    @classmethod
    def from_arrays(
        cls,
        arrays: SamplingArrays,
        num_rows: int,
        vocab_size: int,
        *,
        output_token_ids: list[list[int]],
        generators: dict[int, torch.Generator] | None = None,
        prompt_token_ids: torch.Tensor | None = None,
        logit_bias: list[dict[int, float] | None] | None = None,
        allowed_token_ids_mask: torch.Tensor | None = None,
        bad_words_token_ids: list[list[list[int]]] | None = None,
        min_tokens: dict[int, tuple[int, frozenset[int]]] | None = None,
        max_num_logprobs: int | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """Tensors for rows ``[0, num_rows)`` of ``arrays``; features no row uses become
        None. ``prompt_token_ids`` (padded, see ``padded_token_ids``) is required when a
        row has a penalty."""
        if len(output_token_ids) != num_rows:
            raise ValueError(
                f"output_token_ids has {len(output_token_ids)} rows, expected {num_rows}"
            )
        temperature = arrays.temperature[:num_rows]
        greedy = temperature < _GREEDY_EPS
        top_k = arrays.top_k[:num_rows]
        top_k = np.where((top_k <= 0) | (top_k > vocab_size), vocab_size, top_k)
        top_p, min_p = arrays.top_p[:num_rows], arrays.min_p[:num_rows]
        presence = arrays.presence_penalty[:num_rows]
        frequency = arrays.frequency_penalty[:num_rows]
        repetition = arrays.repetition_penalty[:num_rows]
        use_penalties = bool(presence.any() or frequency.any() or (repetition != 1.0).any())
        if use_penalties and prompt_token_ids is None:
            raise ValueError("prompt_token_ids is required when a row has a penalty")

        return cls(
            temperature=_tensor(np.where(greedy, 0.0, temperature).astype(np.float32), device),
            all_greedy=bool(greedy.all()),
            all_random=not greedy.any(),
            top_k=_tensor(top_k, device) if (top_k < vocab_size).any() else None,
            top_p=_tensor(top_p, device) if (top_p < 1).any() else None,
            min_p=_tensor(min_p, device) if min_p.any() else None,
            generators=generators or {},
            presence_penalties=_tensor(presence, device) if use_penalties else None,
            frequency_penalties=_tensor(frequency, device) if use_penalties else None,
            repetition_penalties=_tensor(repetition, device) if use_penalties else None,
            prompt_token_ids=prompt_token_ids if use_penalties else None,
            output_token_ids=output_token_ids,
            logit_bias=logit_bias or [None] * num_rows,
            allowed_token_ids_mask=allowed_token_ids_mask,
            bad_words_token_ids=bad_words_token_ids or [[] for _ in range(num_rows)],
            min_tokens=min_tokens or {},
            max_num_logprobs=max_num_logprobs,
        )


def allowed_token_ids_mask(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor | None:
    """[B, V] bool, True where a row may sample the token; None when no row restricts."""
    rows = [(row, p.allowed_token_ids) for row, p in enumerate(params) if p.allowed_token_ids]
    if not rows:
        return None
    mask = torch.ones(len(params), vocab_size, dtype=torch.bool)
    for row, allowed in rows:
        mask[row] = False
        mask[row, allowed] = True
    return mask.to(device)


def min_tokens_rows(
    params: Sequence[SamplingParams], eos_token_ids: Iterable[int] = ()
) -> dict[int, tuple[int, frozenset[int]]]:
    """row -> (min_tokens, the stop and EOS ids to suppress below it) for rows that set
    min_tokens. EOS is left alone for requests with ``ignore_eos``."""
    eos = frozenset(eos_token_ids)
    return {
        row: (p.min_tokens, frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else eos))
        for row, p in enumerate(params)
        if p.min_tokens > 0
    }


def _tensor(column: np.ndarray, device: torch.device | str) -> torch.Tensor:
    # A copy: the runner rewrites its arrays while the previous step's tensors live on.
    return torch.tensor(column, device=device)


def check_token_ids(row: int, params: SamplingParams, vocab_size: int) -> None:
    """Token ids a request names must index the vocabulary; say which field is wrong."""
    named = {
        "logit_bias": list(params.logit_bias or ()),
        "allowed_token_ids": params.allowed_token_ids or [],
        "stop_token_ids": params.stop_token_ids,
        "bad_words": [t for seq in params.bad_words_token_ids for t in seq],
    }
    for name, ids in named.items():
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"row {row}: {name} has token ids outside the vocabulary "
                f"[0, {vocab_size}): {bad[:5]}"
            )
    if params.logprobs is not None and params.logprobs > vocab_size:
        raise ValueError(
            f"row {row}: logprobs={params.logprobs} exceeds the vocabulary size {vocab_size}"
        )
