"""The runner's bitmask application: exactly the tokens the bits allow keep their logits,
only in the constrained rows; logits wider than the bitmask get their extra ids masked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo.worker.grammar_bitmask import apply_grammar_bitmask, grammar_rows

from .bits import allowed_ids


def _random_case(vocab: int, rows: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32))
    bitmask = rng.integers(-(2**31), 2**31, size=(rows, -(-vocab // 32)), dtype=np.int64)
    return logits, bitmask.astype(np.int32)


@pytest.mark.parametrize("vocab", [32, 100, 49152])
def test_only_allowed_tokens_keep_their_logits(vocab: int) -> None:
    seed = draw_seed()
    logits, bitmask = _random_case(vocab, 5, seed)
    rows = [3, 0, 2]
    masked = logits.clone()
    apply_grammar_bitmask(masked, bitmask[:3], rows)
    for i, row in enumerate(rows):
        kept = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
        assert kept == allowed_ids(bitmask[i], vocab), f"seed {seed} row {row}"
        assert torch.equal(masked[row][list(kept)], logits[row][list(kept)]), f"seed {seed}"
    assert torch.equal(masked[[1, 4]], logits[[1, 4]]), f"seed {seed}: unconstrained rows"


def test_ids_past_the_bitmask_are_masked() -> None:
    logits = torch.zeros(2, 100)
    apply_grammar_bitmask(logits, np.full((1, 2), -1, np.int32), [1])
    assert torch.isfinite(logits[1, :64]).all() and torch.isinf(logits[1, 64:]).all()
    assert torch.isfinite(logits[0]).all()


def test_grammar_rows_match_by_request_id() -> None:
    assert grammar_rows(["a", "b", "c"], ["c", "x", "a"]) == ([0, 2], [2, 0])
    assert grammar_rows([], ["a"]) == ([], [])
