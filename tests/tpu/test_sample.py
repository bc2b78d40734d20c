"""The TPU backend's JAX sampler (octavo_tpu.sample), on JAX's CPU devices, against the
references of the core's sampler tests (float64 numpy per row, chi-square) and against the
core's torch Sampler itself.

Inputs are random from a seed of each test (in every failure message), except in the
statistical tests, which use fixed seeds so that they cannot flake.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from octavo.testing.seeds import draw_seed

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from octavo.sample.sampler import Sampler  # noqa: E402
from octavo.sampling_params import SamplingParams  # noqa: E402
from octavo_tpu.sample import SamplingTensors, sample, sample_jit, top_logprobs  # noqa: E402
from octavo_tpu.sample.sampler import truncated_logits  # noqa: E402
from tests.core.sample.test_sampler import (  # noqa: E402
    DISTRIBUTIONS,
    WRONG_DISTRIBUTIONS,
    _log_softmax,
    _random_requests,
    chi_square_pvalue,
    metadata_from_params,
    reference_probs,
    reference_processed,
)

NUM_DRAWS = 2**15  # rows of one batch: the draws of a statistical test, vectorised
P_VALUE_MIN = 1e-3
STATS_SEED = 20231  # fixed: the statistical tests are deterministic


@pytest.fixture
def seed() -> int:
    return draw_seed()


def _logits(rng: np.random.Generator, rows: int, vocab_size: int, scale: float = 3.0
            ) -> np.ndarray:
    return (rng.standard_normal((rows, vocab_size)) * scale).astype(np.float32)


def _log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    return np.stack([_log_softmax(row.astype(np.float64)) for row in logits])


# --- greedy and logprobs -------------------------------------------------------------------


def test_greedy_is_argmax_and_logprobs_are_log_softmax(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = _logits(rng, 8, 300)
    t = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 6, 8, [0] * 6)
    out = sample_jit(logits, t, num_logprobs=5)
    want = _log_softmax_rows(logits)
    np.testing.assert_array_equal(out.token_ids, logits.argmax(axis=1), err_msg=f"seed {seed}")
    np.testing.assert_allclose(out.logprobs, want.max(axis=1), atol=1e-5, err_msg=f"seed {seed}")
    assert out.top is not None
    lists = out.top.to_lists(6)
    assert lists.token_ids.dtype == np.int64 and lists.ranks.dtype == np.int64
    assert lists.token_ids.shape == (6, 6) and lists.ranks.tolist() == [1] * 6


def test_top_logprobs_layout_matches_numpy(seed: int) -> None:
    """Column 0 the given token, then the top-n; rank = tokens at least as likely."""
    rng = np.random.default_rng(seed)
    logits = _logits(rng, 16, 200)
    token_ids = rng.integers(0, 200, size=16).astype(np.int32)
    top = top_logprobs(jnp.asarray(logits), jnp.asarray(token_ids), 4)
    want = _log_softmax_rows(logits)
    lists = top.to_lists(16)
    np.testing.assert_array_equal(lists.token_ids[:, 0], token_ids)
    np.testing.assert_array_equal(lists.token_ids[:, 1:], np.argsort(-want, axis=1)[:, :4],
                                  err_msg=f"seed {seed}")
    np.testing.assert_allclose(lists.logprobs, np.take_along_axis(want, lists.token_ids, 1),
                               atol=1e-5, err_msg=f"seed {seed}")
    ranks = (want >= want[np.arange(16), token_ids][:, None]).sum(axis=1)
    np.testing.assert_array_equal(lists.ranks, ranks, err_msg=f"seed {seed}")
    with pytest.raises(ValueError, match=r"num_logprobs must be in \[0, 200\], got 201"):
        top_logprobs(jnp.asarray(logits), jnp.asarray(token_ids), 201)


def test_processors_penalties_and_logprobs_match_the_core_sampler(seed: int) -> None:
    """Greedy rows with every processor and penalty (random, some neutral): the same tokens
    and logprobs as octavo.sample.Sampler, and the processed logits of the per-row
    reference."""
    vocab_size, num_reqs = 40, 12
    params, prompts, outputs = _random_requests(random.Random(seed), num_reqs, vocab_size)
    for p in params:
        p.temperature = 0.0
    logits = _logits(np.random.default_rng(seed), 16, vocab_size)
    core = Sampler()(torch.from_numpy(logits[:num_reqs]), metadata_from_params(
        params, vocab_size, prompt_token_ids=prompts, output_token_ids=outputs,
        eos_token_ids=[0]))
    assert core.logprobs is not None
    n = max(p.logprobs or 0 for p in params)
    t = SamplingTensors.from_params(
        params, 16, [len(o) for o in outputs], vocab_size=vocab_size,
        prompt_token_ids=prompts, output_token_ids=outputs, eos_token_ids=[0])
    out = sample_jit(logits, t, num_logprobs=n)
    message = f"seed {seed}"
    np.testing.assert_array_equal(out.token_ids[:num_reqs], core.sampled_token_ids.numpy(),
                                  err_msg=message)
    assert out.top is not None
    got, want = out.top.to_lists(num_reqs), core.logprobs.tolists()
    np.testing.assert_array_equal(got.token_ids, want.token_ids, err_msg=message)
    np.testing.assert_array_equal(got.ranks, want.ranks, err_msg=message)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5,
                               err_msg=message)
    for row in range(num_reqs):
        reference = _log_softmax(reference_processed(
            logits[row], params[row], prompts[row], outputs[row], {0}))
        np.testing.assert_allclose(out.logprobs[row], reference[out.token_ids[row]],
                                   rtol=1e-5, atol=1e-5, err_msg=f"{message}: row {row}")


# --- truncation ----------------------------------------------------------------------------


def _reference_kept(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens a row may draw (float64 reference), and the tokens so close to the min-p
    or top-p boundary (1e-5) that float32 may decide them either way."""
    scaled = reference_probs(logits, SamplingParams(temperature=params.temperature))
    near = np.abs(scaled - params.min_p * scaled.max()) < 1e-5
    if params.top_p < 1:  # top-p sees the distribution left by min-p and top-k
        q = reference_probs(logits, SamplingParams(
            temperature=params.temperature, min_p=params.min_p, top_k=params.top_k))
        order = np.argsort(-q)
        mass_before = np.empty_like(q)
        mass_before[order] = np.cumsum(q[order]) - q[order]
        near |= np.abs(mass_before - params.top_p) < 1e-5
    return reference_probs(logits, params) > 0, near


def test_truncation_masks_match_numpy_reference(seed: int) -> None:
    """Per-row random temperature, top-k, top-p and min-p (each sometimes off): exactly the
    reference's tokens stay, up to float32 rounding at a boundary."""
    rng = np.random.default_rng(seed)
    vocab_size, num_rows = 64, 32
    params = [SamplingParams(
        temperature=float(rng.uniform(0.3, 2.0)),
        top_k=int(rng.choice([0, rng.integers(1, vocab_size + 8)])),
        top_p=float(rng.choice([1.0, rng.uniform(0.05, 1.0)])),
        min_p=float(rng.choice([0.0, rng.uniform(0.0, 0.5)])),
    ) for _ in range(num_rows)]
    logits = _logits(rng, num_rows, vocab_size)
    t = SamplingTensors.from_params(params, num_rows, [0] * num_rows)
    kept = np.isfinite(np.asarray(jax.jit(truncated_logits)(logits, t)))
    for row, p in enumerate(params):
        want, near = _reference_kept(logits[row], p)
        wrong = (kept[row] != want) & ~near
        assert not wrong.any(), (f"seed {seed}: row {row} {p}: tokens "
                                 f"{np.flatnonzero(wrong).tolist()} wrongly kept or dropped")
        assert kept[row].any(), f"seed {seed}: row {row} kept nothing"


def test_truncation_skipped_rows_and_ties() -> None:
    """Top-k keeps every token tied with the k-th; top_k past the vocabulary, 0 and top_p
    1 keep all."""
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 2.0]] * 4, dtype=np.float32)
    params = [SamplingParams(top_k=2), SamplingParams(top_k=99), SamplingParams(top_k=-1),
              SamplingParams(top_p=1.0)]
    t = SamplingTensors.from_params(params, 4, [0] * 4)
    kept = np.isfinite(np.asarray(truncated_logits(jnp.asarray(logits), t)))
    assert kept.tolist() == [[False, True, True, False, False]] + [[True] * 5] * 3


# --- distributions -------------------------------------------------------------------------


def _draw_counts(logits: np.ndarray, params: SamplingParams, seed: int) -> np.ndarray:
    """``NUM_DRAWS`` draws from one logits row: one batch of identical unseeded rows."""
    t = SamplingTensors.from_params([params] * NUM_DRAWS, NUM_DRAWS, [0] * NUM_DRAWS,
                                    rng=np.random.default_rng(seed))
    batch = np.broadcast_to(logits, (NUM_DRAWS, len(logits)))
    return np.bincount(np.asarray(sample_jit(batch, t).token_ids), minlength=len(logits))


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_sampled_frequencies_match_exact_distribution(name: str) -> None:
    params = DISTRIBUTIONS[name]
    # Logits of their own per case: with shared ones top_k=6 and top_p=0.7 kept one set.
    rng = np.random.default_rng([STATS_SEED, list(DISTRIBUTIONS).index(name)])
    logits = (rng.standard_normal(20) * 1.5).astype(np.float32)
    counts = _draw_counts(logits, params, STATS_SEED)
    p_value = chi_square_pvalue(counts, reference_probs(logits, params))
    assert p_value > P_VALUE_MIN, f"{name}: p-value {p_value:.2e}"


@pytest.mark.parametrize("name", WRONG_DISTRIBUTIONS)
def test_chi_square_rejects_a_wrong_distribution(name: str) -> None:
    """Negative control: the test above sees a slightly wrong distribution."""
    sampled_with, claimed = WRONG_DISTRIBUTIONS[name]
    logits = np.random.default_rng(STATS_SEED + 1).standard_normal(20).astype(np.float32)
    counts = _draw_counts(logits, sampled_with, STATS_SEED)
    p_value = chi_square_pvalue(counts, reference_probs(logits, claimed))
    assert p_value < P_VALUE_MIN, f"{name} not rejected, p-value {p_value:.2e}"


def test_mixed_rows_keep_their_own_laws() -> None:
    """Interleaved settings plus greedy rows in one batch: each group has its law and the
    greedy rows are the argmax."""
    settings = [SamplingParams(top_k=4), SamplingParams(temperature=2.0, top_p=0.9),
                SamplingParams(temperature=0.0)]
    logits = np.random.default_rng(STATS_SEED + 2).standard_normal(12).astype(np.float32)
    params = [settings[i % 3] for i in range(NUM_DRAWS)]
    t = SamplingTensors.from_params(params, NUM_DRAWS, [0] * NUM_DRAWS,
                                    rng=np.random.default_rng(STATS_SEED))
    tokens = np.asarray(sample_jit(np.broadcast_to(logits, (NUM_DRAWS, 12)), t).token_ids)
    assert (tokens[2::3] == logits.argmax()).all()
    for group in (0, 1):
        counts = np.bincount(tokens[group::3], minlength=12)
        p_value = chi_square_pvalue(counts, reference_probs(logits, settings[group]))
        assert p_value > P_VALUE_MIN, f"group {group}: p-value {p_value:.2e}"


# --- seeds and padding ---------------------------------------------------------------------


def test_seeded_rows_ignore_their_neighbours_and_repeat(seed: int) -> None:
    """A seeded request draws the same token at the same output position whatever the
    batch (its row, the bucket, the neighbours' settings and fresh keys); its tokens vary
    with the position and with the seed."""
    rng = np.random.default_rng(seed)
    vocab_size = 1000
    flat = np.zeros(vocab_size, dtype=np.float32)  # uniform: every draw shows
    request = SamplingParams(temperature=1.0, seed=2**40 + 7)
    neighbours = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0.0),
                  SamplingParams(seed=1), None, SamplingParams(top_p=0.2)]

    def draw(row: int, num_rows: int, position: int, params: SamplingParams = request) -> int:
        batch = [neighbours[i % len(neighbours)] for i in range(num_rows)]
        batch[row] = params
        positions = rng.integers(0, 50, num_rows)
        positions[row] = position
        logits = _logits(rng, num_rows, vocab_size)
        logits[row] = flat
        t = SamplingTensors.from_params(batch, num_rows, positions)
        return int(sample_jit(logits, t).token_ids[row])

    first = [draw(0, 8, position) for position in range(6)]
    assert [draw(5, 16, position) for position in range(6)] == first, f"seed {seed}"
    assert [draw(3, 8, position) for position in range(6)] == first, f"seed {seed}"
    assert len(set(first)) > 1, f"seed {seed}: the same token at every position"
    other = SamplingParams(temperature=1.0, seed=7)  # the low word of the seed alone
    assert [draw(0, 8, position, other) for position in range(6)] != first, f"seed {seed}"


def test_unseeded_rows_draw_afresh_each_step() -> None:
    flat = np.zeros((64, 1000), dtype=np.float32)
    t = [SamplingTensors.from_params([SamplingParams()] * 64, 64, [0] * 64) for _ in range(2)]
    first, second = (np.asarray(sample_jit(flat, ti).token_ids) for ti in t)
    assert (first != second).any()


def test_padding_rows_change_nothing(seed: int) -> None:
    """The same requests in bucket 8 and bucket 32, the padding rows' logits garbage
    (huge, NaN): the real rows' tokens and logprobs are identical."""
    rng = np.random.default_rng(seed)
    params = [SamplingParams(seed=11, top_k=5), SamplingParams(temperature=0.0),
              SamplingParams(seed=12, top_p=0.5, min_p=0.1), SamplingParams(temperature=0.0),
              SamplingParams(seed=13, repetition_penalty=1.3, logit_bias={3: 2.0})]
    real = _logits(rng, len(params), 50)
    kwargs = dict(vocab_size=50, prompt_token_ids=[[1, 2]] * 5, output_token_ids=[[3]] * 5)
    results = []
    for num_rows in (8, 32):
        garbage = _logits(rng, num_rows - len(params), 50, scale=1e30)
        garbage[::2, ::3] = np.nan
        t = SamplingTensors.from_params(params, num_rows, [1] * 5, **kwargs)
        out = sample_jit(np.concatenate([real, garbage]), t, num_logprobs=3)
        assert out.top is not None
        results.append((np.asarray(out.token_ids[:5]), np.asarray(out.logprobs[:5]),
                        out.top.to_lists(5).logprobs))
    for got, want in zip(results[0], results[1], strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")
    assert np.isfinite(results[0][1]).all()


def test_padding_rows_are_neutral_greedy() -> None:
    t = SamplingTensors.from_params([SamplingParams(temperature=0.7, top_k=3), None], 4,
                                    [2, 9])
    assert t.temperature.tolist() == pytest.approx([0.7, 0, 0, 0])
    assert t.top_k.tolist() == [3, 0, 0, 0] and t.top_p.tolist() == [1.0] * 4
    assert t.min_p.tolist() == [0.0] * 4 and t.positions.tolist() == [2, 9, 0, 0]
    assert t.penalties is None and t.bias is None


# --- compilation ---------------------------------------------------------------------------


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """The jit cache misses while the test runs: JAX lowers a program on each, even when a
    persistent compilation cache then supplies the binary."""
    events: list[str] = []

    def listener(name: str, _duration: float, **_: object) -> None:
        if name == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield events
    jax.monitoring.unregister_event_duration_listener(listener)


def test_compiles_once_per_bucket(compiles: list[str], seed: int) -> None:
    """Different values (all greedy, mixed, seeds, every filter, penalties on and forced
    on) compile nothing new within a bucket; a new bucket compiles once more."""
    rng = np.random.default_rng(seed)
    vocab_size = 37  # a shape no other test compiles
    batches = [
        [SamplingParams(temperature=0.0)] * 3,
        [SamplingParams(temperature=0.9, top_k=4, seed=3), None, SamplingParams(top_p=0.5)],
        [SamplingParams(min_p=0.2, repetition_penalty=1.5)] * 5,
        [SamplingParams(temperature=1.7, presence_penalty=0.5)],
    ]
    fn = jax.jit(sample)
    counts = []
    for num_rows in (8, 16):
        for params in batches:
            t = SamplingTensors.from_params(
                params, num_rows, [2] * len(params), vocab_size=vocab_size,
                prompt_token_ids=[[1, 5]] * len(params), output_token_ids=[[2, 2]] * len(params),
                with_penalties=True)
            before = len(compiles)
            fn(_logits(rng, num_rows, vocab_size), t).token_ids.block_until_ready()
            counts.append(len(compiles) - before)
    assert counts == [1, 0, 0, 0] * 2, counts


# --- building the tensors ------------------------------------------------------------------


def test_bad_input_is_named() -> None:
    p = SamplingParams()
    with pytest.raises(ValueError, match="num_rows=1 cannot hold 2 requests"):
        SamplingTensors.from_params([p, p], 1, [0, 0])
    with pytest.raises(ValueError, match="step_positions has shape"):
        SamplingTensors.from_params([p, p], 2, [0])
    with pytest.raises(ValueError, match="vocab_size .* logit_bias"):
        SamplingTensors.from_params([SamplingParams(logit_bias={1: 1.0})], 1, [0])
    with pytest.raises(ValueError, match="row 0: logit_bias names token id 9"):
        SamplingTensors.from_params([SamplingParams(logit_bias={9: 1.0})], 1, [0], vocab_size=9)
    with pytest.raises(ValueError, match="prompt_token_ids is required"):
        SamplingTensors.from_params([SamplingParams(repetition_penalty=1.2)], 1, [0],
                                    vocab_size=9, output_token_ids=[[]])
    t = SamplingTensors.from_params([p], 2, [0], vocab_size=9, with_bias=True)
    with pytest.raises(ValueError, match=r"bias has shape \(2, 9\), the logits \(2, 10\)"):
        sample(jnp.zeros((2, 10)), t)
