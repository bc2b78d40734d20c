"""The n-gram proposer against a plain-Python reference, on random token sequences."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.testing.seeds import draw_seed
from octavo_spec_decode.ngram import find_ngram_drafts


def reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Longest suffix first; its most recent earlier occurrence that has a next token."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_matches_the_reference_on_random_sequences() -> None:
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    for _ in range(500):
        vocab = int(rng.integers(2, 6))  # small vocabularies: many repeats
        tokens = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        k = int(rng.integers(1, 6))
        got = find_ngram_drafts(np.array(tokens, dtype=np.int64), min_n, max_n, k).tolist()
        assert got == reference(tokens, min_n, max_n, k), f"seed={seed} tokens={tokens}"


@pytest.mark.parametrize(("tokens", "expected"), [
    ([1, 2, 3, 4, 1, 2], [3, 4, 1]),  # "1 2" occurred before: continue with what followed
    ([5, 6, 7, 8], []),  # nothing repeats
    ([1, 2, 9, 1, 2, 8, 1, 2], [8, 1, 2]),  # the most recent occurrence wins
    ([3, 1, 2, 7, 0, 1, 2, 5, 3, 1, 2], [7, 0, 1]),  # the longest suffix ("3 1 2") wins
])
def test_examples(tokens: list[int], expected: list[int]) -> None:
    assert find_ngram_drafts(np.array(tokens), 2, 3, 3).tolist() == expected
