"""Padded step shapes: every step's token count and request count are rounded up to a
power of two, so the whole run needs a handful of compiled programs, all built at start-up
(a shape first seen while serving would stall that step for a compile)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKEN_BUCKET = 8  # fewer tokens than this still pad to it: decode batches of 1-8 share one


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """``low, 2 low, ...`` up to the first power of two ``>= high`` (``low`` a power of 2)."""
    sizes = [low]
    while sizes[-1] < high:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def bucket(sizes: tuple[int, ...], n: int) -> int:
    """The smallest of ``sizes`` that holds ``n``."""
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} exceeds the largest compiled size {sizes[-1]}")


@dataclass(frozen=True)
class Buckets:
    """The token and request counts steps are padded to; a step of ``r`` requests has at
    least ``r`` tokens, so only the pairs with ``reqs <= tokens`` are compiled."""

    tokens: tuple[int, ...]
    reqs: tuple[int, ...]

    @classmethod
    def for_limits(cls, max_num_batched_tokens: int, max_num_seqs: int) -> Buckets:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive, got "
                             f"{max_num_batched_tokens} and {max_num_seqs}")
        return cls(tokens=powers_of_two(MIN_TOKEN_BUCKET, max_num_batched_tokens),
                   reqs=powers_of_two(1, min(max_num_seqs, max_num_batched_tokens)))

    def pairs(self) -> list[tuple[int, int]]:
        return [(t, r) for t in self.tokens for r in self.reqs if r <= t]

    def pad(self, num_tokens: int, num_reqs: int) -> tuple[int, int]:
        return bucket(self.tokens, num_tokens), bucket(self.reqs, num_reqs)
