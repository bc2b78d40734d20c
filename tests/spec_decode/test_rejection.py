"""The rejection sampler keeps the target distribution: chi-square tests, position by
position, on a small vocabulary with random target and draft distributions."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from octavo.spec_decode import rejection
from octavo.spec_decode.rejection import rejection_sample
from octavo.testing.seeds import draw_seed

VOCAB = 6
K = 3
N = 40_000


def _random_dists(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Random distributions with some zero entries (as top-k/top-p leave them)."""
    logits = torch.randn(*shape, VOCAB, generator=generator) * 1.5
    logits[torch.rand(*shape, VOCAB, generator=generator) < 0.2] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-3.0)  # at least one token stays
    return logits.softmax(dim=-1)


def _run(seed: int, one_hot: bool, use_draft_probs: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """N independent requests sharing p_0..p_K (fixed per position) and q_1..q_K."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    p = _random_dists(g, (K + 1,))
    q = _random_dists(g, (K,))
    if one_hot:  # a deterministic proposer: the same drafts every time
        drafts = torch.randint(VOCAB, (K,), generator=g).expand(N, K).clone()
    else:
        drafts = torch.multinomial(q, N, replacement=True, generator=g).T.contiguous()
    target_probs = p.expand(N, K + 1, VOCAB).contiguous()
    out = rejection_sample(
        drafts, torch.full((N,), K), target_probs.argmax(-1), target_probs,
        torch.zeros(N, dtype=torch.bool),
        draft_probs=q.expand(N, K, VOCAB).contiguous() if use_draft_probs else None)
    return out.token_ids, p


def _worst_p_value(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Token j of the outputs that reach position j must follow p_j."""
    worst = 1.0
    for j in range(K + 1):
        reached = tokens[:, j] >= 0
        counts = torch.bincount(tokens[reached, j], minlength=VOCAB).double().numpy()
        probs = p[j].double().numpy()
        expected = probs / probs.sum() * counts.sum()
        support = expected > 0
        assert counts[~support].sum() == 0, f"position {j}: a token of probability 0 was drawn"
        if counts.sum() < 500:
            continue
        worst = min(worst, chisquare(counts[support], expected[support]).pvalue)
    return worst


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_drafts_keep_the_target_distribution(seed: int) -> None:
    tokens, p = _run(seed, one_hot=False, use_draft_probs=True)
    assert _worst_p_value(tokens, p) > 1e-4, f"seed {seed}"


@pytest.mark.parametrize("seed", [4, 5])
def test_one_hot_drafts_keep_the_target_distribution(seed: int) -> None:
    tokens, p = _run(seed, one_hot=True, use_draft_probs=False)
    assert _worst_p_value(tokens, p) > 1e-4, f"seed {seed}"


def test_a_wrong_sampler_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: resampling a rejected position from p instead of the residual
    max(0, p - q) over-weights the tokens the drafts propose - the test must see it."""

    def from_p(target_probs, draft_probs, draft_token_ids, num_accepted, num_drafts):
        return target_probs[torch.arange(target_probs.shape[0]), num_accepted]

    monkeypatch.setattr(rejection, "_final_distribution", from_p)
    p_values = [_worst_p_value(*_run(seed, one_hot=False, use_draft_probs=True))
                for seed in (1, 2, 3)]
    assert max(p_values) < 1e-6, f"p-values {p_values}"


def test_greedy_rows_accept_while_drafts_match_the_argmax() -> None:
    argmax = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6], [0, 0, 0, 0]])
    drafts = torch.tensor([[3, 1, 0], [5, 0, 2], [1, 0, 0]])
    out = rejection_sample(drafts, torch.tensor([3, 3, 2]), argmax, None,
                           torch.ones(3, dtype=torch.bool))
    assert out.tolists() == [[3, 1, 4], [5, 9], [0]]


def test_seeded_rows_are_reproducible() -> None:
    g = torch.Generator().manual_seed(7)
    probs = _random_dists(g, (4, K + 1))
    drafts = torch.randint(VOCAB, (4, K), generator=g)

    def run() -> list[list[int]]:
        gens = {row: torch.Generator().manual_seed(100 + row) for row in range(4)}
        return rejection_sample(drafts, torch.tensor([3, 2, 1, 0]), probs.argmax(-1), probs,
                                torch.zeros(4, dtype=torch.bool), generators=gens).tolists()

    first = run()
    torch.manual_seed(draw_seed())  # the global stream must not matter
    assert run() == first
