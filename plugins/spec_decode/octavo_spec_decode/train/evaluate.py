"""Acceptance of trained heads, measured through the real engine on held-out prompts."""

from __future__ import annotations

from dataclasses import dataclass

from octavo import LLM, SamplingParams


@dataclass
class Acceptance:
    method: str
    k: int
    num_prompts: int
    num_verifications: int
    mean_tokens_per_step: float  # accepted drafts + the bonus token, per verification
    position_rates: list[float]

    def summary(self) -> str:
        rates = ", ".join(f"{r:.2f}" for r in self.position_rates)
        return (f"held-out ({self.num_prompts} prompts, greedy, k={self.k}): "
                f"{self.mean_tokens_per_step:.2f} tokens per verification step over "
                f"{self.num_verifications} steps; acceptance per draft position: {rates}")


def measure_acceptance(model: str | None, method: str, heads: str, k: int,
                       prompts: list[str], max_tokens: int) -> Acceptance:
    """Greedy generation with the heads; the engine's own acceptance counters."""
    llm = LLM(model=model, dtype="float32", speculative_config={
        "method": method, "model": heads, "num_speculative_tokens": k})
    llm.chat([[{"role": "user", "content": p}] for p in prompts],
             SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    stats = llm.llm_engine.core.scheduler.spec.snapshot()
    return Acceptance(method, k, len(prompts), stats.num_drafts,
                      stats.mean_acceptance_length, stats.position_rates())
