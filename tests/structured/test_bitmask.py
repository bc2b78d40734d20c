"""The runner's bitmask application: the same as xgrammar's own kernel, and as reading the
bits one by one; logits wider than the bitmask get their extra ids masked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xgrammar as xgr

from octavo.sample.bitmask import apply_grammar_bitmask, grammar_rows, unpack_bitmask


def _random_case(vocab: int, rows: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32))
    bitmask = rng.integers(-(2**31), 2**31, size=(rows, -(-vocab // 32)), dtype=np.int64)
    return logits, bitmask.astype(np.int32)


@pytest.mark.parametrize("vocab", [32, 100, 49152])
def test_matches_xgrammar_kernel(vocab: int) -> None:
    seed = int(np.random.default_rng().integers(1 << 30))
    logits, bitmask = _random_case(vocab, 5, seed)
    rows = [0, 2, 3]
    ours = logits.clone()
    apply_grammar_bitmask(ours, bitmask[:3], rows)
    theirs = logits.clone()
    full = np.full_like(bitmask, -1)  # all allowed: rows 1 and 4 are unconstrained
    full[rows] = bitmask[:3]
    xgr.apply_token_bitmask_inplace(theirs, torch.from_numpy(full))
    assert torch.equal(ours, theirs), f"seed {seed}"
    assert torch.equal(ours[[1, 4]], logits[[1, 4]]), f"seed {seed}"


def test_unpack_reads_bit_t_of_word_t_over_32() -> None:
    seed = int(np.random.default_rng().integers(1 << 30))
    _, bitmask = _random_case(70, 3, seed)
    allowed = unpack_bitmask(torch.from_numpy(bitmask), 80).numpy()
    for r in range(3):
        for t in range(80):
            expected = bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1)
            assert allowed[r, t] == expected, f"seed {seed} row {r} token {t}"
    # Ids past the bitmask (logits wider than the grammar's vocabulary) are never allowed.
    wide = unpack_bitmask(torch.from_numpy(np.full((1, 2), -1, np.int32)), 100)
    assert wide[0, :64].all() and not wide[0, 64:].any()


def test_grammar_rows_match_by_request_id() -> None:
    assert grammar_rows(["a", "b", "c"], ["c", "x", "a"]) == ([0, 2], [2, 0])
    assert grammar_rows([], ["a"]) == ([], [])
