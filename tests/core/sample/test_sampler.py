"""The batched sampler against straightforward references: exact distributions (chi-square),
per-row Python implementations of the logits processors and penalties, and log_softmax.

Inputs are random from a seed of each test; every assertion message carries it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import fields

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from octavo.sample.logprobs import compute_prompt_logprobs
from octavo.sample.metadata import (
    SamplingArrays,
    SamplingMetadata,
    allowed_token_ids_mask,
    check_token_ids,
    make_generator,
    min_tokens_rows,
    padded_token_ids,
)
from octavo.sample.penalties import apply_penalties
from octavo.sample.processors import apply_logits_processors
from octavo.sample.sampler import ARGMAX_BLOCK, Sampler, draw_tokens, greedy_argmax
from octavo.sample.topk_topp import NUM_CANDIDATES, _sort_and_truncate, apply_top_k_top_p
from octavo.sampling_params import SamplingParams, SamplingType
from octavo.testing.seeds import draw_seed

NUM_DRAWS = 20_000
P_VALUE_MIN = 1e-4  # a true distribution fails by chance 0.01% of the time per test


def metadata_from_params(
    params: Sequence[SamplingParams],
    vocab_size: int,
    *,
    output_token_ids: list[list[int]] | None = None,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    eos_token_ids: Iterable[int] = (),
    device: torch.device | str = "cpu",
) -> SamplingMetadata:
    """The sampling metadata of a batch of requests, one row each, built from their params
    as the model runner builds it from its persistent batch.

    ``generators`` defaults to a fresh one per seeded random row (right for one step;
    across steps pass the same generators again). ``eos_token_ids`` are suppressed
    together with ``stop_token_ids`` while a row is under ``min_tokens``, unless the
    request sets ``ignore_eos``.
    """
    num_rows = len(params)
    outputs = output_token_ids if output_token_ids is not None else [[] for _ in params]
    arrays = SamplingArrays.empty(num_rows)
    for row, p in enumerate(params):
        arrays.set_row(row, p)
        check_token_ids(row, p, vocab_size)
    if generators is None:
        generators = {
            row: make_generator(p.seed, device)
            for row, p in enumerate(params)
            if p.seed is not None and p.sampling_type != SamplingType.GREEDY
        }
    num_logprobs = [p.logprobs for p in params if p.logprobs is not None]
    return SamplingMetadata.from_arrays(
        arrays,
        num_rows,
        vocab_size,
        output_token_ids=outputs,
        generators=generators,
        prompt_token_ids=(
            None if prompt_token_ids is None
            else padded_token_ids(prompt_token_ids, vocab_size, device)
        ),
        logit_bias=[p.logit_bias or None for p in params],
        allowed_token_ids_mask=allowed_token_ids_mask(params, vocab_size, device),
        bad_words_token_ids=[p.bad_words_token_ids for p in params],
        min_tokens=min_tokens_rows(params, eos_token_ids),
        max_num_logprobs=max(num_logprobs) if num_logprobs else None,
        device=device,
    )



@pytest.fixture
def seed() -> int:
    """Fresh entropy each run; seeds torch and is quoted in failure messages."""
    value = draw_seed()
    torch.manual_seed(value)
    return value


# --- references ---------------------------------------------------------------------------


def reference_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a random row must sample from, one filter at a time in float64."""
    z = logits.astype(np.float64) / params.temperature
    if params.min_p > 0:
        p = _softmax(z)
        z[p < params.min_p * p.max()] = -np.inf
    if params.top_k > 0:
        z[np.argsort(-z)[params.top_k:]] = -np.inf
    if params.top_p < 1:
        p = _softmax(z)
        order = np.argsort(-p)
        mass_before = np.cumsum(p[order]) - p[order]
        z[order[mass_before >= params.top_p]] = -np.inf
    return _softmax(z)


def reference_processed(
    logits: np.ndarray, params: SamplingParams, prompt: list[int], output: list[int],
    eos: set[int],
) -> np.ndarray:
    """Processors then penalties for one row, written the obvious way, in float64."""
    z = logits.astype(np.float64).copy()
    if params.allowed_token_ids:
        banned = np.ones(len(z), dtype=bool)
        banned[params.allowed_token_ids] = False
        z[banned] = -np.inf
    for token_id, bias in (params.logit_bias or {}).items():
        z[token_id] += bias
    for sequence in params.bad_words_token_ids:
        prefix = sequence[:-1]
        if not prefix or output[-len(prefix):] == prefix:
            z[sequence[-1]] = -np.inf
    if len(output) < params.min_tokens:
        for token_id in params.stop_token_ids + ([] if params.ignore_eos else sorted(eos)):
            z[token_id] = -np.inf
    for token_id in set(prompt) | set(output):
        if z[token_id] > 0:
            z[token_id] /= params.repetition_penalty
        else:
            z[token_id] *= params.repetition_penalty
    for token_id, count in Counter(output).items():
        z[token_id] -= params.frequency_penalty * count + params.presence_penalty
    return z


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _log_softmax(z: np.ndarray) -> np.ndarray:
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of sampled ``counts`` to ``probs``. Drawing a token of probability 0
    is impossible under the claim: p-value 0. The least likely tokens share one bin until
    it expects at least 5 draws, which keeps the chi-square approximation valid."""
    if counts[probs == 0].any():
        return 0.0
    order = np.argsort(probs)
    expected, observed = probs[order] * counts.sum(), counts[order]
    cut = int(np.searchsorted(np.cumsum(expected), 5.0)) + 1
    expected = np.append(expected[:cut].sum(), expected[cut:])
    observed = np.append(observed[:cut].sum(), observed[cut:])
    if len(expected) < 2:
        return 1.0  # a single possible token: nothing left to test
    return float(chisquare(observed, expected).pvalue)


def draw_counts(logits: torch.Tensor, params: SamplingParams, num_draws: int) -> np.ndarray:
    """Sample one logits row ``num_draws`` times in one batch of identical rows."""
    row = SamplingArrays.empty(1)
    row.set_row(0, params)
    arrays = SamplingArrays(
        **{f.name: np.repeat(getattr(row, f.name), num_draws) for f in fields(row)}
    )
    vocab_size = logits.shape[0]
    metadata = SamplingMetadata.from_arrays(
        arrays, num_draws, vocab_size, output_token_ids=[[] for _ in range(num_draws)]
    )
    sampled = Sampler()(logits.expand(num_draws, -1), metadata).sampled_token_ids
    return np.bincount(sampled.numpy(), minlength=vocab_size)


# --- distributions ------------------------------------------------------------------------

DISTRIBUTIONS = {
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(top_k=6),
    "top_p": SamplingParams(top_p=0.7),
    "min_p": SamplingParams(min_p=0.08),
    "combined": SamplingParams(temperature=1.3, min_p=0.1, top_k=12, top_p=0.8),
}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_sampled_frequencies_match_exact_distribution(name: str, seed: int) -> None:
    params = DISTRIBUTIONS[name]
    logits = torch.randn(20) * 1.5
    counts = draw_counts(logits, params, NUM_DRAWS)
    p_value = chi_square_pvalue(counts, reference_probs(logits.numpy(), params))
    assert p_value > P_VALUE_MIN, f"seed {seed}: {name} p-value {p_value:.2e}"


def test_draw_follows_unnormalised_weights_and_never_picks_a_zero(seed: int) -> None:
    """The inverse-cdf draw on raw weights (the rejection sampler's residuals are not
    normalised), zeros among them and at both ends; across a 49k vocabulary too, where the
    cumulative sum runs long."""
    for vocab_size in (9, 49_152):
        weights = torch.rand(vocab_size) * 3
        zeros = torch.tensor([0, 4, vocab_size - 1])
        weights[zeros] = 0
        support = torch.randperm(vocab_size - 1)[:7] + 1 if vocab_size > 9 else None
        if support is not None:  # a few heavy tokens over a long light tail
            weights[support] += 5000.0
        chunk = 500  # rows a call: the fp64 cdf of 49k tokens is 393 kB a row
        drawn = torch.cat([draw_tokens(weights.expand(chunk, -1), {})
                           for _ in range(NUM_DRAWS // chunk)])
        counts = np.bincount(drawn.numpy(), minlength=vocab_size)
        assert counts[zeros.numpy()].sum() == 0, f"seed {seed}: drew a zero-weight token"
        weights = weights.double()
        if support is None:
            probs = (weights / weights.sum()).numpy()
        else:  # pool the tail so every expected count is large enough for chi-square
            counts = np.append(counts[support.numpy()], NUM_DRAWS - counts[support.numpy()].sum())
            heavy = weights[support] / weights.sum()
            probs = np.append(heavy.numpy(), 1 - heavy.sum().item())
        p_value = chi_square_pvalue(counts, probs)
        assert p_value > P_VALUE_MIN, f"seed {seed}: V={vocab_size} p-value {p_value:.2e}"


def test_top_k_top_p_among_candidates_keeps_what_the_full_sort_keeps(seed: int) -> None:
    """Over a vocabulary larger than the candidate set: peaked rows, flat rows (whose top_p
    reaches past the candidates), large top_k, filters off in some rows and -inf already in
    others all keep exactly the tokens one full sort keeps."""
    rows, vocab_size = 48, 3 * NUM_CANDIDATES
    logits = torch.randn(rows, vocab_size) * torch.linspace(0.02, 6.0, rows).unsqueeze(1)
    logits[::7, : vocab_size // 2] = float("-inf")  # e.g. a grammar's mask
    top_k = torch.tensor([[5, 40, NUM_CANDIDATES, NUM_CANDIDATES + 300, vocab_size][i % 5]
                          for i in range(rows)])
    top_p = torch.tensor([[0.5, 0.9, 0.95, 1.0][i % 4] for i in range(rows)])
    for k, p in ((top_k, top_p), (None, top_p), (top_k, None)):
        expected = _sort_and_truncate(logits.clone(), k, p).isfinite()
        actual = apply_top_k_top_p(logits.clone(), k, p).isfinite()
        assert torch.equal(actual, expected), (
            f"seed {seed}: rows {(actual != expected).any(dim=1).nonzero().flatten().tolist()}"
            f" differ (top_k {'on' if k is not None else 'off'}, "
            f"top_p {'on' if p is not None else 'off'})")


WRONG_DISTRIBUTIONS = {
    # what is sampled, and what the test is wrongly told it should be
    "temperature off by 25%": (SamplingParams(temperature=1.0), SamplingParams(temperature=1.25)),
    "top_k one token short": (SamplingParams(top_k=6), SamplingParams(top_k=5)),
    "top_k one token too many": (SamplingParams(top_k=6), SamplingParams(top_k=7)),
    "top_p too small": (SamplingParams(top_p=0.7), SamplingParams(top_p=0.5)),
}


@pytest.mark.parametrize("name", WRONG_DISTRIBUTIONS)
def test_chi_square_rejects_a_wrong_distribution(name: str, seed: int) -> None:
    """Negative control: the test above has the power to see small mistakes. The logits
    are flatter here so that each wrong claim differs from the truth by some margin."""
    sampled_with, claimed = WRONG_DISTRIBUTIONS[name]
    logits = torch.randn(20)
    counts = draw_counts(logits, sampled_with, NUM_DRAWS)
    p_value = chi_square_pvalue(counts, reference_probs(logits.numpy(), claimed))
    assert p_value < P_VALUE_MIN, f"seed {seed}: {name} not rejected, p-value {p_value:.2e}"


def test_rows_with_different_settings_sample_independently(seed: int) -> None:
    """Interleaved rows of two settings plus greedy rows: each group keeps its own law."""
    settings = [SamplingParams(top_k=4), SamplingParams(temperature=2.0, top_p=0.9),
                SamplingParams(temperature=0.0)]
    logits = torch.randn(20) * 1.5
    params = [settings[i % 3] for i in range(3 * 5000)]
    metadata = metadata_from_params(params, 20)
    sampled = Sampler()(logits.expand(len(params), -1), metadata).sampled_token_ids.numpy()
    for group in range(2):
        counts = np.bincount(sampled[group::3], minlength=20)
        p_value = chi_square_pvalue(counts, reference_probs(logits.numpy(), settings[group]))
        assert p_value > P_VALUE_MIN, f"seed {seed}: group {group} p-value {p_value:.2e}"
    assert (sampled[2::3] == int(logits.argmax())).all(), f"seed {seed}"


# --- seeds --------------------------------------------------------------------------------


def _seeded_tokens(
    steps: list[torch.Tensor], batch: list[SamplingParams], row: int
) -> list[int]:
    """Tokens of ``batch[row]`` over several steps; its logits are ``steps[i]``, the other
    rows get fresh random logits. Generators persist across steps as in the model runner."""
    generators = {
        i: make_generator(p.seed) for i, p in enumerate(batch) if p.seed is not None
    }
    tokens = []
    for step_logits in steps:
        logits = torch.randn(len(batch), step_logits.shape[0]) * 3
        logits[row] = step_logits
        metadata = metadata_from_params(batch, logits.shape[1], generators=generators)
        tokens.append(int(Sampler()(logits, metadata).sampled_token_ids[row]))
    return tokens


def test_seeded_row_is_independent_of_batch_composition(seed: int) -> None:
    request = SamplingParams(seed=seed % 10_000, top_p=0.95, temperature=1.2)
    steps = [torch.randn(1000)] * 12  # the same logits each step: only the generator moves
    others = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(seed=7, top_k=3)]
    batches = [
        ([request], 0),
        ([request, *others], 0),
        ([*others, request], 3),
        ([others[2], request, others[0], others[0], others[1]], 1),
        ([others[2], request], 1),  # every row seeded: the global generator is never used
    ]
    reference = _seeded_tokens(steps, *batches[0])
    for batch, row in batches[1:]:
        assert _seeded_tokens(steps, batch, row) == reference, f"seed {seed}: row {row}"
    assert len(set(reference)) > 1, f"seed {seed}: persistent generator repeats its draws"

    other_seed = SamplingParams(seed=seed % 10_000 + 1, top_p=0.95, temperature=1.2)
    assert _seeded_tokens(steps, [other_seed], 0) != reference, f"seed {seed}"


# --- greedy and logits processors -----------------------------------------------------------


def test_greedy_is_argmax_in_greedy_and_mixed_batches(seed: int) -> None:
    logits = torch.randn(8, 100)
    all_greedy = metadata_from_params([SamplingParams(temperature=0.0)] * 8, 100)
    assert all_greedy.all_greedy
    sampled = Sampler()(logits, all_greedy).sampled_token_ids
    assert torch.equal(sampled, logits.argmax(dim=1)), f"seed {seed}"

    mixed = [SamplingParams(temperature=0.0 if i % 2 else 1.0) for i in range(8)]
    sampled = Sampler()(logits, metadata_from_params(mixed, 100)).sampled_token_ids
    assert torch.equal(sampled[1::2], logits[1::2].argmax(dim=1)), f"seed {seed}"


@pytest.mark.parametrize("feature", ["none", "logit_bias", "allowed_token_ids", "min_tokens",
                                     "repetition_penalty"])
def test_greedy_batch_reads_the_logits_as_given_only_when_nothing_rewrites_them(
        seed: int, feature: str) -> None:
    """A greedy batch without logprobs takes the argmax of the caller's logits as they are
    unless a processor or penalty is on (``edits_logits``); either way the caller's logits
    stay untouched and every processor still applies."""
    logits = torch.randn(4, 60)
    before = logits.clone()
    best = int(logits[1].argmax())
    settings = {
        "none": {},
        "logit_bias": {"logit_bias": {best: -100.0}},
        "allowed_token_ids": {"allowed_token_ids": [i for i in range(60) if i != best]},
        "min_tokens": {"min_tokens": 3, "stop_token_ids": [best]},
        "repetition_penalty": {"repetition_penalty": 1.5},
    }[feature]
    params = [SamplingParams(temperature=0.0)] * 4
    params[1] = SamplingParams(temperature=0.0, **settings)
    metadata = metadata_from_params(params, 60, prompt_token_ids=[[0]] * 4)
    assert metadata.edits_logits == (feature != "none")
    sampled = Sampler()(logits, metadata).sampled_token_ids
    assert torch.equal(logits, before), f"seed {seed}"
    assert torch.equal(sampled[[0, 2, 3]], logits[[0, 2, 3]].argmax(dim=1)), f"seed {seed}"
    if feature in ("none", "repetition_penalty"):  # token 0's penalty may move row 1
        expected = apply_penalties(apply_logits_processors(logits.clone(), metadata), metadata)
        assert int(sampled[1]) == int(expected[1].argmax()), f"seed {seed}"
    else:
        assert int(sampled[1]) != best, f"seed {seed}"


@pytest.mark.parametrize("vocab", [ARGMAX_BLOCK * 5, ARGMAX_BLOCK * 5 + 3])
def test_blocked_argmax_is_torch_argmax(seed: int, vocab: int) -> None:
    """The same index as ``argmax`` for every row: the first of equal maxima, whether they
    lie in one block or in two; a NaN before or after an inf; a row of -inf; a vocabulary
    the blocks do not divide (plain argmax)."""
    logits = torch.randn(9, vocab)
    top = logits.max() + 1
    logits[0, [7, 3 * ARGMAX_BLOCK + 1]] = top  # equal maxima in different blocks
    logits[1, [ARGMAX_BLOCK + 9, ARGMAX_BLOCK + 2]] = top  # ... in one block
    logits[2, 1] = top
    logits[2, -1] = top  # the last entry ties with an earlier one
    logits[3, [5, 2 * ARGMAX_BLOCK]] = torch.tensor([float("inf"), float("nan")])
    logits[4, [5, 2 * ARGMAX_BLOCK]] = torch.tensor([float("nan"), float("inf")])
    logits[5] = float("-inf")
    logits[6, -1] = top  # the maximum in the last entry
    expected = logits.argmax(dim=-1)
    assert expected[0] == 7 and expected[1] == ARGMAX_BLOCK + 2  # the cases are what they say
    assert torch.equal(greedy_argmax(logits), expected), f"seed {seed}"


def test_logit_bias_steers_greedy_choice(seed: int) -> None:
    logits = torch.randn(2, 50)
    best = int(logits[1].argmax())
    second = int(logits[1].topk(2).indices[1])
    params = [SamplingParams(temperature=0.0, logit_bias={7: 100.0}),
              SamplingParams(temperature=0.0, logit_bias={best: -100.0})]
    sampled = Sampler()(logits, metadata_from_params(params, 50)).sampled_token_ids
    assert sampled.tolist() == [7, second], f"seed {seed}"


def test_allowed_token_ids_restrict_random_draws(seed: int) -> None:
    allowed = random.Random(seed).sample(range(30), 3)
    params = [SamplingParams(temperature=1.5, allowed_token_ids=allowed)] * 3000
    logits = torch.randn(30).expand(3000, -1)
    sampled = Sampler()(logits, metadata_from_params(params, 30)).sampled_token_ids
    assert set(sampled.tolist()) == set(allowed), f"seed {seed}"


def test_bad_words_ban_only_the_completing_token(seed: int) -> None:
    bad_words = [[5], [1, 2], [3, 4, 6]]
    outputs = [[9], [9, 1], [3, 4], [4], [1, 2, 3]]
    params = [SamplingParams(_bad_words_token_ids=bad_words) for _ in outputs]
    metadata = metadata_from_params(params, 10, output_token_ids=outputs)
    logits = apply_logits_processors(torch.randn(len(outputs), 10), metadata)
    banned = {row: set(np.flatnonzero(np.isinf(logits[row].numpy()))) for row in range(5)}
    assert banned == {0: {5}, 1: {5, 2}, 2: {5, 6}, 3: {5}, 4: {5}}, f"seed {seed}"


def test_update_from_tokenizer_keeps_both_spellings() -> None:
    class WordTokenizer:
        vocab = {"bad": 1, " bad": 2, "word": 3, " word": 4, " two": 5, "two": 5}

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            pieces = text.replace(" ", "| ").split("|")
            return [self.vocab[p] for p in pieces if p]

    params = SamplingParams(bad_words=["bad word", " two"])
    params.update_from_tokenizer(WordTokenizer())
    # "two" and " two" are one token here, so only one spelling is kept.
    assert params.bad_words_token_ids == [[1, 4], [2, 4], [5]]


def test_min_tokens_suppresses_stop_and_eos_until_reached(seed: int) -> None:
    params = [SamplingParams(min_tokens=3, stop_token_ids=[4]),
              SamplingParams(min_tokens=3, stop_token_ids=[4]),
              SamplingParams(min_tokens=3, stop_token_ids=[4], ignore_eos=True)]
    outputs = [[1, 1], [1, 1, 1], [1]]
    metadata = metadata_from_params(params, 10, output_token_ids=outputs,
                                            eos_token_ids=[0])
    logits = apply_logits_processors(torch.randn(3, 10), metadata)
    banned = [set(np.flatnonzero(np.isinf(row.numpy()))) for row in logits]
    assert banned == [{0, 4}, set(), {4}], f"seed {seed}"
    outputs[1].pop()  # the lists are read at sampling time, so the runner may edit them
    logits = apply_logits_processors(torch.randn(3, 10), metadata)
    assert set(np.flatnonzero(np.isinf(logits[1].numpy()))) == {0, 4}, f"seed {seed}"


# --- penalties and logprobs ---------------------------------------------------------------


def _random_requests(
    rng: random.Random, num_rows: int, vocab_size: int
) -> tuple[list[SamplingParams], list[list[int]], list[list[int]]]:
    """Rows with random penalties (some neutral), processors and histories."""
    params, prompts, outputs = [], [], []
    for _ in range(num_rows):
        def token() -> int:
            return rng.randrange(vocab_size)
        params.append(SamplingParams(
            temperature=rng.choice([0.0, 0.8]),
            repetition_penalty=rng.choice([1.0, rng.uniform(0.5, 2.0)]),
            frequency_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
            presence_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
            logit_bias=rng.choice([None, {token(): rng.uniform(-5, 5) for _ in range(3)}]),
            allowed_token_ids=rng.choice([None, rng.sample(range(vocab_size), 10)]),
            _bad_words_token_ids=[[token()], [token(), token()]],
            min_tokens=rng.choice([0, 4]),
            stop_token_ids=[token()],
            logprobs=rng.randrange(6),
        ))
        prompts.append([token() for _ in range(rng.randrange(1, 12))])
        outputs.append([token() for _ in range(rng.randrange(0, 8))])
    return params, prompts, outputs


def test_processors_and_penalties_match_per_row_reference(seed: int) -> None:
    vocab_size = 40
    params, prompts, outputs = _random_requests(random.Random(seed), 12, vocab_size)
    metadata = metadata_from_params(
        params, vocab_size, prompt_token_ids=prompts, output_token_ids=outputs,
        eos_token_ids=[0],
    )
    logits = torch.randn(12, vocab_size) * 3
    got = apply_penalties(apply_logits_processors(logits.clone(), metadata), metadata)
    for row in range(12):
        want = reference_processed(logits[row].numpy(), params[row], prompts[row],
                                   outputs[row], {0})
        np.testing.assert_allclose(got[row].numpy(), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"seed {seed}: row {row}")


def test_logprobs_are_log_softmax_of_processed_logits(seed: int) -> None:
    vocab_size = 40
    params, prompts, outputs = _random_requests(random.Random(seed), 12, vocab_size)
    metadata = metadata_from_params(
        params, vocab_size, prompt_token_ids=prompts, output_token_ids=outputs,
        eos_token_ids=[0],
    )
    logits = torch.randn(12, vocab_size) * 3
    out = Sampler()(logits, metadata)
    assert out.logprobs is not None
    n = max(p.logprobs or 0 for p in params)
    lists = out.logprobs.tolists()
    assert lists.token_ids.shape == (12, n + 1) and lists.ranks.shape == (12,)
    for row in range(12):
        want = _log_softmax(reference_processed(logits[row].numpy(), params[row],
                                                prompts[row], outputs[row], {0}))
        sampled = int(out.sampled_token_ids[row])
        message = f"seed {seed}: row {row}"
        assert np.isfinite(want[sampled]), message
        if params[row].temperature == 0:
            assert sampled == int(np.argmax(want)), message
        assert lists.token_ids[row, 0] == sampled, message
        np.testing.assert_allclose(lists.logprobs[row], want[lists.token_ids[row]],
                                   rtol=1e-5, atol=1e-5, err_msg=message)
        np.testing.assert_allclose(lists.logprobs[row, 1:], np.sort(want)[::-1][:n],
                                   rtol=1e-5, atol=1e-5, err_msg=message)
        assert lists.ranks[row] == (want >= want[sampled]).sum(), message


def test_prompt_logprobs_are_raw_log_softmax(seed: int) -> None:
    logits = torch.randn(7, 30) * 2
    next_ids = torch.randint(0, 30, (7,))
    out = compute_prompt_logprobs(logits, next_ids, 4)
    want = torch.log_softmax(logits.double(), dim=-1).float()
    assert torch.equal(out.token_ids[:, 0], next_ids), f"seed {seed}"
    torch.testing.assert_close(out.logprobs[:, 0], want.gather(1, next_ids[:, None])[:, 0])
    torch.testing.assert_close(out.logprobs[:, 1:], want.topk(4, dim=1).values)
    assert torch.equal(out.token_ids[:, 1:], want.topk(4, dim=1).indices), f"seed {seed}"
    ranks = (want > want.gather(1, next_ids[:, None])).sum(dim=1) + 1
    assert torch.equal(out.ranks, ranks), f"seed {seed}"


def test_arrays_follow_rows_moved_by_the_runner(seed: int) -> None:
    """The runner's path (persistent arrays, rows compacted) gives the same metadata as
    building from the params in their new order."""
    params = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0.0),
              SamplingParams(top_p=0.8, min_p=0.1, presence_penalty=0.5)]
    arrays = SamplingArrays.empty(8)
    for row, p in enumerate(params):
        arrays.set_row(row, p)
    arrays.copy_row(2, 0)  # row 0 finished; the last row moves into its place
    kept = [params[2], params[1]]
    outputs: list[list[int]] = [[1, 2], []]
    prompts = [[3], []]
    got = SamplingMetadata.from_arrays(arrays, 2, 9, output_token_ids=outputs,
                                       prompt_token_ids=padded_token_ids(prompts, 9))
    want = metadata_from_params(kept, 9, output_token_ids=outputs,
                                        prompt_token_ids=prompts)
    for f in fields(SamplingMetadata):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
        else:
            assert a == b, f.name


# --- bad input ----------------------------------------------------------------------------


def test_token_ids_outside_the_vocabulary_are_named() -> None:
    with pytest.raises(ValueError, match="row 1: logit_bias .* 50"):
        metadata_from_params([SamplingParams(), SamplingParams(logit_bias={50: 1.0})],
                                     50)
    with pytest.raises(ValueError, match="row 0: allowed_token_ids"):
        metadata_from_params([SamplingParams(allowed_token_ids=[-1])], 50)


def test_penalties_require_prompt_token_ids() -> None:
    with pytest.raises(ValueError, match="prompt_token_ids is required"):
        metadata_from_params([SamplingParams(repetition_penalty=1.2)], 50)
