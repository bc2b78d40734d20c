"""``SamplingTensors``: one step's sampling settings as fixed-shape arrays, one row per slot
of the padded request count ``R``.

The sampler is compiled once per bucket of ``R``, so nothing here may change a shape with
the requests' values: every per-request setting is an array of ``R`` rows, rows past the
real requests (and rows given ``None``) carry neutral greedy settings, and the two optional
dense parts (``penalties``, ``bias`` [R, V]) are either absent or present for the whole
batch. Their presence is part of the pytree's structure and therefore of the compile key:
at most four variants per bucket, and a worker that must never compile while serving can
force them on (``with_penalties`` / ``with_bias``) to keep one.

Randomness follows the core's per-request generators in meaning, not in bits: a seeded
request's draw at output position ``i`` uses the key ``fold_in(key(seed), i)``, so it gets
the same tokens every run whatever else is in the batch (and after a preemption, since the
key depends on the position rather than on how many draws came before); unseeded rows get
fresh keys from ``rng``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from octavo.plugin_api import SamplingParams, SamplingType

_INT32_MAX = 2**31 - 1


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Penalties:
    """Repetition (CTRL/HF), frequency and presence (OpenAI) penalties with the token
    counts they need, dense so that the shapes do not depend on how long requests are."""

    presence: np.ndarray | jax.Array  # f32[R]; 0 = off
    frequency: np.ndarray | jax.Array  # f32[R]; 0 = off
    repetition: np.ndarray | jax.Array  # f32[R]; 1 = off
    output_counts: np.ndarray | jax.Array  # i32[R, V]: occurrences among the outputs so far
    prompt_mask: np.ndarray | jax.Array  # bool[R, V]: the token occurs in the prompt


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SamplingTensors:
    """Per-row settings in the encoding ``sample`` reads (see the module docstring)."""

    temperature: np.ndarray | jax.Array  # f32[R]; 0 = greedy
    top_k: np.ndarray | jax.Array  # i32[R]; 0 (or anything outside [1, V)) = off
    top_p: np.ndarray | jax.Array  # f32[R]; 1 = off
    min_p: np.ndarray | jax.Array  # f32[R]; 0 = off
    key_data: np.ndarray | jax.Array  # u32[R, 2]: threefry key of the seed (hi, lo words)
    positions: np.ndarray | jax.Array  # i32[R]: output position each row samples
    penalties: Penalties | None = None
    # f32[R, V] added to the logits: logit_bias values, -inf for tokens that
    # allowed_token_ids, bad_words or min_tokens forbid this step.
    bias: np.ndarray | jax.Array | None = None

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams | None],
        num_rows: int,
        step_positions: Sequence[int] | np.ndarray,
        *,
        vocab_size: int | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        output_token_ids: Sequence[Sequence[int]] | None = None,
        eos_token_ids: Iterable[int] = (),
        rng: np.random.Generator | None = None,
        with_penalties: bool = False,
        with_bias: bool = False,
    ) -> SamplingTensors:
        """Numpy arrays for ``params`` in rows ``[0, len(params))`` of ``num_rows``.

        ``params[i]`` is None for a row that samples nothing this step (it is padded like
        the rows past the end). ``step_positions[i]`` is how many output tokens request
        ``i`` already has: the position of the token it samples now. ``vocab_size`` is
        needed once a row uses a dense feature; penalties need ``prompt_token_ids`` and
        bad words, frequency and presence penalties ``output_token_ids`` (one list per
        row of ``params``). ``eos_token_ids`` are banned with ``stop_token_ids`` while a
        row is under ``min_tokens`` (unless it sets ``ignore_eos``), as in the core.
        """
        rows = _Rows.check(params, num_rows, step_positions, output_token_ids)
        rng = rng if rng is not None else np.random.default_rng()
        dense = _DenseInputs(vocab_size, prompt_token_ids, output_token_ids, eos_token_ids)
        use_penalties = with_penalties or any(map(_uses_penalties, rows.live))
        use_bias = with_bias or any(_uses_bias(p, pos) for p, pos in rows.live_positions())
        return cls(
            temperature=rows.column(_temperature, 0.0, np.float32),
            top_k=rows.column(lambda p: min(p.top_k, _INT32_MAX), 0, np.int32),  # > V: off
            top_p=rows.column(lambda p: p.top_p, 1.0, np.float32),
            min_p=rows.column(lambda p: p.min_p, 0.0, np.float32),
            key_data=_key_data(rows, rng),
            positions=rows.positions(),
            penalties=dense.penalties(rows) if use_penalties else None,
            bias=dense.bias(rows) if use_bias else None,
        )


    @staticmethod
    def uses_dense(params: Sequence[SamplingParams | None],
                   step_positions: Sequence[int]) -> bool:
        """Whether any row needs a dense part (penalties or the bias) at these positions."""
        return any(p is not None and (_uses_penalties(p) or _uses_bias(p, int(position)))
                   for p, position in zip(params, step_positions, strict=True))


@dataclass
class _Rows:
    """The checked request rows of one step and the padded size they go into."""

    params: Sequence[SamplingParams | None]
    num_rows: int
    step_positions: np.ndarray  # int64 [len(params)]

    @classmethod
    def check(cls, params: Sequence[SamplingParams | None], num_rows: int,
              step_positions: Sequence[int] | np.ndarray,
              output_token_ids: Sequence[Sequence[int]] | None) -> _Rows:
        if num_rows < max(len(params), 1):
            raise ValueError(f"num_rows={num_rows} cannot hold {len(params)} requests "
                             "(and must be at least 1)")
        positions = np.asarray(step_positions, dtype=np.int64)
        if positions.shape != (len(params),):
            raise ValueError(f"step_positions has shape {positions.shape}, expected "
                             f"({len(params)},): one output position per request")
        if (positions < 0).any() or (positions >= 2**31).any():
            raise ValueError(f"step_positions must be in [0, 2**31), got {positions.tolist()}")
        if output_token_ids is not None and len(output_token_ids) != len(params):
            raise ValueError(f"output_token_ids has {len(output_token_ids)} rows, expected "
                             f"{len(params)}")
        return cls(params, num_rows, positions)

    @property
    def live(self) -> list[SamplingParams]:
        return [p for p in self.params if p is not None]

    def live_positions(self) -> list[tuple[SamplingParams, int]]:
        return [(p, int(pos)) for p, pos in zip(self.params, self.step_positions, strict=True)
                if p is not None]

    def column(self, value: Callable[[SamplingParams], float], neutral: float,
               dtype: type) -> np.ndarray:
        """One setting per row: ``value(params)`` for requests, ``neutral`` for the rest."""
        out: np.ndarray = np.full(self.num_rows, neutral, dtype=dtype)
        for row, p in enumerate(self.params):
            if p is not None:
                out[row] = value(p)
        return out

    def positions(self) -> np.ndarray:
        out = np.zeros(self.num_rows, dtype=np.int32)
        out[: len(self.params)] = self.step_positions
        return out


def _temperature(params: SamplingParams) -> float:
    return 0.0 if params.sampling_type == SamplingType.GREEDY else params.temperature


def _key_data(rows: _Rows, rng: np.random.Generator) -> np.ndarray:
    """Seeded rows: the 64-bit seed as two 32-bit words (what ``jax.random.PRNGKey`` makes
    of a seed under x64); every other row a fresh random key."""
    out = rng.integers(0, 2**32, size=(rows.num_rows, 2), dtype=np.uint32)
    for row, p in enumerate(rows.params):
        if p is not None and p.seed is not None:
            seed = p.seed % 2**64  # negative seeds wrap, as a uint64 would hold them
            out[row] = (seed >> 32, seed & 0xFFFFFFFF)
    return out


def _uses_penalties(params: SamplingParams) -> bool:
    return bool(params.repetition_penalty != 1.0 or params.presence_penalty
                or params.frequency_penalty)


def _uses_bias(params: SamplingParams, position: int) -> bool:
    return bool(params.logit_bias or params.allowed_token_ids or params.bad_words_token_ids
                or position < params.min_tokens)


@dataclass
class _DenseInputs:
    """What the [R, V] parts are built from; each is checked when a row needs it."""

    vocab_size: int | None
    prompt_token_ids: Sequence[Sequence[int]] | None
    output_token_ids: Sequence[Sequence[int]] | None
    eos_token_ids: Iterable[int]

    def penalties(self, rows: _Rows) -> Penalties:
        vocab_size = self._vocab_size("penalties")
        counts = np.zeros((rows.num_rows, vocab_size), dtype=np.int32)
        prompt_mask = np.zeros((rows.num_rows, vocab_size), dtype=bool)
        for row, p in enumerate(rows.params):
            if p is None or not _uses_penalties(p):
                continue
            prompt_mask[row, self._ids("prompt_token_ids", row)] = True
            output = self._ids("output_token_ids", row)
            counts[row] = np.bincount(output, minlength=vocab_size)
        return Penalties(
            presence=rows.column(lambda p: p.presence_penalty, 0.0, np.float32),
            frequency=rows.column(lambda p: p.frequency_penalty, 0.0, np.float32),
            repetition=rows.column(lambda p: p.repetition_penalty, 1.0, np.float32),
            output_counts=counts,
            prompt_mask=prompt_mask,
        )

    def bias(self, rows: _Rows) -> np.ndarray:
        """logit_bias added, then -inf over what allowed_token_ids, bad_words and
        min_tokens forbid: the core's processors in order, as one addition."""
        vocab_size = self._vocab_size("logit_bias / allowed_token_ids / bad_words / min_tokens")
        out = np.zeros((rows.num_rows, vocab_size), dtype=np.float32)
        eos = sorted(set(self.eos_token_ids))
        for row, (p, position) in enumerate(zip(rows.params, rows.step_positions, strict=True)):
            if p is None or not _uses_bias(p, int(position)):
                continue
            for token_id, value in (p.logit_bias or {}).items():
                out[row, self._token(row, "logit_bias", token_id)] = value
            if p.allowed_token_ids:
                allowed = [self._token(row, "allowed_token_ids", t) for t in p.allowed_token_ids]
                banned = np.ones(vocab_size, dtype=bool)
                banned[allowed] = False
                out[row, banned] = -np.inf
            for token_id in self._bad_word_bans(row, p):
                out[row, token_id] = -np.inf
            if position < p.min_tokens:
                for token_id in [*p.stop_token_ids, *([] if p.ignore_eos else eos)]:
                    out[row, self._token(row, "stop_token_ids / eos_token_ids", token_id)] = -np.inf
        return out

    def _bad_word_bans(self, row: int, params: SamplingParams) -> list[int]:
        """A bad word's last token, when the output ends with the rest of it (a one-token
        bad word always)."""
        bans = []
        for *prefix, last in params.bad_words_token_ids:
            self._token(row, "bad_words", last)
            if not prefix:
                bans.append(last)
                continue
            output = self._ids("output_token_ids", row).tolist()
            if output[len(output) - len(prefix):] == prefix:
                bans.append(last)
        return bans

    def _vocab_size(self, feature: str) -> int:
        if self.vocab_size is None or self.vocab_size < 1:
            raise ValueError(f"vocab_size (a positive int) is required when a request uses "
                             f"{feature}; got {self.vocab_size!r}")
        return self.vocab_size

    def _ids(self, name: str, row: int) -> np.ndarray:
        lists = getattr(self, name)
        if lists is None:
            raise ValueError(f"{name} is required: request row {row} uses a penalty or "
                             "bad_words, which read the tokens so far")
        ids = np.asarray(lists[row], dtype=np.int64)
        vocab_size = self._vocab_size(name)
        if ((ids < 0) | (ids >= vocab_size)).any():
            raise ValueError(f"row {row}: {name} has token ids outside the vocabulary "
                             f"[0, {vocab_size})")
        return ids

    def _token(self, row: int, name: str, token_id: int) -> int:
        vocab_size = self._vocab_size(name)
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"row {row}: {name} names token id {token_id}, outside the "
                             f"vocabulary [0, {vocab_size})")
        return token_id
