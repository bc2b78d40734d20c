"""Prefix-cache statistics: how many prompt tokens were looked up and how many were found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counted once per request, when it is first given KV blocks; a request resumed after
    preemption finds its own earlier blocks and would inflate the rate, so it is not counted
    again. Tokens, not blocks, so the rate reads as "share of prompt tokens not recomputed"."""

    requests: int = 0
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens whose KV came from the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def record(self, num_queried: int, num_hit: int) -> None:
        self.requests += 1
        self.queries += num_queried
        self.hits += num_hit
