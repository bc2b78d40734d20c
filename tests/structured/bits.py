"""Reading a grammar bitmask in tests, independently of the code under test."""

from __future__ import annotations

import numpy as np


def allowed_ids(bitmask_row: np.ndarray, vocab_size: int) -> set[int]:
    """The token ids a bitmask row allows: bit ``t % 32`` of int32 word ``t // 32``."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask_row, dtype="<i4").view(np.uint8),
                         bitorder="little")
    return set(np.flatnonzero(bits[:vocab_size]).tolist())
