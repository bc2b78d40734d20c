"""Counters the engine reports: prefix-cache hits, KV transfers, speculative decoding.

Plain data (no torch), carried on ``SchedulerStats`` and ``EngineCoreOutput`` to the front
end, which exports them on ``/metrics`` and in benchmark results. Names follow vLLM's
metrics where the concept is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class KVTransferStats:
    """KV-transfer totals of one engine since start: whether prompt KV was loaded or
    recomputed."""

    loads: int = 0  # requests whose prompt KV a connector loaded
    loaded_tokens: int = 0  # prompt tokens loaded instead of computed
    failed_loads: int = 0  # loads that failed: those requests computed their prompt
    saves: int = 0  # requests whose prompt KV a connector saved


@dataclass
class SpecDecodingStats:
    """Acceptance of speculative decoding, per request and for the whole engine.

    Counted by the scheduler when a step's verification comes back: ``num_drafts`` steps
    verified drafts, proposing ``num_draft_tokens`` of them in all, of which
    ``num_accepted_tokens`` were accepted; ``accepted_per_position[j]`` counts how often the
    draft at position ``j`` (0-based; with a draft tree, depth ``j + 1``) was accepted.
    Names follow vLLM's ``vllm:spec_decode_*`` metrics."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int,
               num_positions: int | None = None) -> None:
        """One verification of ``num_draft_tokens`` drafts; ``num_positions``: how many of
        them can be accepted, the tree's depth when they are a tree's nodes."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        positions = num_draft_tokens if num_positions is None else num_positions
        missing = positions - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        """Share of the proposed drafts that were accepted."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens gained per verification step: accepted drafts plus the bonus token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def since(self, earlier: SpecDecodingStats) -> SpecDecodingStats:
        """The counts added after the snapshot ``earlier`` (e.g. a benchmark's timed part)."""
        positions = [n - (earlier.accepted_per_position[i]
                          if i < len(earlier.accepted_per_position) else 0)
                     for i, n in enumerate(self.accepted_per_position)]
        return SpecDecodingStats(self.num_drafts - earlier.num_drafts,
                                 self.num_draft_tokens - earlier.num_draft_tokens,
                                 self.num_accepted_tokens - earlier.num_accepted_tokens,
                                 positions)

    def position_rates(self) -> list[float]:
        """Per draft position, the share of verification steps that accepted it."""
        return [n / self.num_drafts for n in self.accepted_per_position] if self.num_drafts \
            else []


def spec_summary(stats: SpecDecodingStats | None) -> dict[str, object] | None:
    """The figures to report (logs, benchmark JSON), or None when speculation is off."""
    if stats is None:
        return None
    return {"num_drafts": stats.num_drafts, "num_draft_tokens": stats.num_draft_tokens,
            "num_accepted_tokens": stats.num_accepted_tokens,
            "acceptance_rate": stats.acceptance_rate,
            "mean_acceptance_length": stats.mean_acceptance_length,
            "per_position_acceptance_rate": stats.position_rates()}
