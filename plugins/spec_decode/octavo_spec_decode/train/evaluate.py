"""Acceptance of trained heads, measured through the real engine on held-out prompts."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.plugin_api import LLM, SamplingParams


@dataclass
class Acceptance:
    method: str
    k: int
    num_prompts: int
    num_verifications: int
    mean_tokens_per_step: float  # accepted drafts + the bonus token, per verification
    position_rates: list[float]

    tree: list[list[int]] | None = None

    def summary(self) -> str:
        rates = ", ".join(f"{r:.2f}" for r in self.position_rates)
        shape = f"k={self.k}" if self.tree is None else f"k={self.k}, tree {self.tree}"
        return (f"held-out ({self.num_prompts} prompts, greedy, {shape}): "
                f"{self.mean_tokens_per_step:.2f} tokens per verification step over "
                f"{self.num_verifications} steps; acceptance per draft position: {rates}")


def measure_acceptance(model: str | None, method: str, heads: str, k: int,
                       prompts: list[str], max_tokens: int,
                       tree: list[list[int]] | None = None) -> Acceptance:
    """Greedy generation with the heads (drafting ``tree`` if given); the engine's own
    acceptance counters."""
    llm = LLM(model=model, dtype="float32", speculative_config={
        "method": method, "model": heads, "num_speculative_tokens": k,
        "speculative_token_tree": tree})
    llm.chat([[{"role": "user", "content": p}] for p in prompts],
             SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    stats = llm.llm_engine.core.scheduler.make_stats().spec_decoding
    assert stats is not None  # speculative decoding is on
    return Acceptance(method, k, len(prompts), stats.num_drafts,
                      stats.mean_acceptance_length, stats.position_rates(), tree)
