"""The TPU backend's sampler: one token per row of logits [R, V], every row with its own
settings, in fixed shapes for jax.jit (no Python branch reads a value).

Order, as the core's torch sampler (octavo.sample.sampler):
1. the processors that see raw logits: allowed_token_ids, logit_bias, bad_words,
   min_tokens (here one addition of ``SamplingTensors.bias``);
2. repetition, frequency and presence penalties;
3. logprobs: log_softmax of these processed logits, before temperature and truncation
   (the core's choice: banned tokens show -inf);
4. greedy rows (temperature 0): argmax;
5. random rows: temperature, min-p, top-k, top-p, then one draw per row.

The draw is the exponential race (Gumbel-max, ``jax.random.categorical``) rather than the
core's inverse CDF: on a TPU the per-token random numbers are vector work, and it needs no
float64 cumulative sum, which TPUs lack. Each row draws with its own key (see
``SamplingTensors``), so a row's token does not depend on its neighbours. A batch of greedy
rows skips step 5 entirely (``lax.cond``); padding rows are greedy and never trigger it.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from octavo.plugin_api import LogprobsLists
from octavo_tpu.sample.tensors import Penalties, SamplingTensors
from octavo_tpu.sample.truncation import apply_min_p, apply_top_k_top_p


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TopLogprobs:
    """The core's ``LogprobsLists`` layout on device: column 0 the sampled token, then the
    top-n by logprob. Ids are int32 (JAX without x64 has no int64); ``to_lists`` widens."""

    token_ids: jax.Array  # i32[R, n + 1]
    logprobs: jax.Array  # f32[R, n + 1]
    ranks: jax.Array  # i32[R]: rank of the sampled token, 1 = most likely

    def to_lists(self, num_reqs: int) -> LogprobsLists:
        """The first ``num_reqs`` rows (the real requests) as the worker boundary's plain
        numpy arrays, int64 ids and ranks. Sliced on the host: slicing a device array by a
        varying count would compile a program per count."""
        return LogprobsLists(
            token_ids=np.asarray(self.token_ids).astype(np.int64)[:num_reqs],
            logprobs=np.asarray(self.logprobs).astype(np.float32)[:num_reqs],
            ranks=np.asarray(self.ranks).astype(np.int64)[:num_reqs],
        )


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SampleOutput:
    token_ids: jax.Array  # i32[R]
    logprobs: jax.Array  # f32[R]: logprob of the sampled token (processed logits)
    top: TopLogprobs | None = None  # with ``num_logprobs``


def sample(logits: jax.Array, t: SamplingTensors, num_logprobs: int | None = None
           ) -> SampleOutput:
    """Sample ``logits`` [R, V] under ``t`` (R rows). ``num_logprobs`` (static under jit:
    use ``sample_jit`` or mark it static) adds the top-n logprobs of each row."""
    _check_shapes(logits, t)
    processed = process_logits(logits, t)
    greedy_ids = jnp.argmax(processed, axis=-1).astype(jnp.int32)
    token_ids = jax.lax.cond(jnp.all(t.temperature == 0), lambda: greedy_ids,
                             lambda: _sample_mixed(processed, t, greedy_ids))
    logprobs = jax.nn.log_softmax(processed, axis=-1)
    chosen = jnp.take_along_axis(logprobs, token_ids[:, None], axis=1)[:, 0]
    top = None if num_logprobs is None else _gather_top(logprobs, token_ids, num_logprobs)
    return SampleOutput(token_ids=token_ids, logprobs=chosen, top=top)


sample_jit = jax.jit(sample, static_argnames=("num_logprobs",))


def process_logits(logits: jax.Array, t: SamplingTensors) -> jax.Array:
    """Steps 1 and 2: what greedy rows take the argmax of and logprobs are read from."""
    logits = logits.astype(jnp.float32)
    if t.bias is not None:
        logits = logits + t.bias
    if t.penalties is not None:
        logits = _apply_penalties(logits, t.penalties)
    return logits


def top_logprobs(logits: jax.Array, token_ids: jax.Array, n: int) -> TopLogprobs:
    """The logprob and rank of ``token_ids`` [R] and the top ``n`` of each row, from
    log_softmax of ``logits`` [R, V]. The core reads them from the processed logits: pass
    ``process_logits(logits, t)`` (what ``sample`` does with ``num_logprobs``)."""
    return _gather_top(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1),
                       token_ids.astype(jnp.int32), n)


def truncated_logits(logits: jax.Array, t: SamplingTensors) -> jax.Array:
    """Step 5 before the draw: the processed ``logits`` scaled by temperature and
    truncated; a random row draws from their softmax. Greedy rows go through unscaled."""
    temperature = jnp.where(t.temperature == 0, 1.0, t.temperature)
    scaled = logits / temperature[:, None]
    # jnp.asarray: the settings may still be host (numpy) arrays; under jit it is a no-op.
    scaled = apply_min_p(scaled, jnp.asarray(t.min_p))
    return apply_top_k_top_p(scaled, jnp.asarray(t.top_k), jnp.asarray(t.top_p))


def row_keys(t: SamplingTensors) -> jax.Array:
    """One key per row: the row's seed key folded with the output position it samples."""
    keys = jax.random.wrap_key_data(jnp.asarray(t.key_data, dtype=jnp.uint32),
                                    impl="threefry2x32")
    return jax.vmap(jax.random.fold_in)(keys, jnp.asarray(t.positions, dtype=jnp.uint32))


def _sample_mixed(processed: jax.Array, t: SamplingTensors, greedy_ids: jax.Array
                  ) -> jax.Array:
    drawn = jax.vmap(jax.random.categorical)(row_keys(t), truncated_logits(processed, t))
    return jnp.where(t.temperature == 0, greedy_ids, drawn.astype(jnp.int32))


def _apply_penalties(logits: jax.Array, p: Penalties) -> jax.Array:
    """Repetition: a token seen in the prompt or output has a positive logit divided by
    the penalty and a negative one multiplied; then frequency x count and presence."""
    counts = jnp.asarray(p.output_counts)
    seen = jnp.asarray(p.prompt_mask) | (counts > 0)
    factor = jnp.where(seen, p.repetition[:, None], 1.0)
    logits = jnp.where(logits > 0, logits / factor, logits * factor)
    logits = logits - p.frequency[:, None] * counts
    return logits - p.presence[:, None] * (counts > 0)


def _gather_top(logprobs: jax.Array, token_ids: jax.Array, n: int) -> TopLogprobs:
    vocab_size = logprobs.shape[1]
    if not 0 <= n <= vocab_size:
        raise ValueError(f"num_logprobs must be in [0, {vocab_size}], got {n}")
    chosen = jnp.take_along_axis(logprobs, token_ids[:, None], axis=1)
    top, top_ids = jax.lax.top_k(logprobs, n)
    return TopLogprobs(
        token_ids=jnp.concatenate([token_ids[:, None], top_ids.astype(jnp.int32)], axis=1),
        logprobs=jnp.concatenate([chosen, top], axis=1),
        # As the core (and vLLM): the number of tokens at least as likely.
        ranks=jnp.sum(logprobs >= chosen, axis=1, dtype=jnp.int32),
    )


def _check_shapes(logits: jax.Array, t: SamplingTensors) -> None:
    """Shapes are static, so a mismatch is caught while tracing, with names."""
    if logits.ndim != 2 or logits.shape[0] != t.num_rows:
        raise ValueError(f"logits must be [R, V] with R = {t.num_rows} rows of the "
                         f"SamplingTensors, got shape {tuple(logits.shape)}")
    dense = {"bias": t.bias}
    if t.penalties is not None:
        dense |= {"penalties.output_counts": t.penalties.output_counts,
                  "penalties.prompt_mask": t.penalties.prompt_mask}
    for name, array in dense.items():
        if array is not None and tuple(array.shape) != tuple(logits.shape):
            raise ValueError(f"SamplingTensors.{name} has shape {tuple(array.shape)}, the "
                             f"logits {tuple(logits.shape)}: built for another vocab_size?")
