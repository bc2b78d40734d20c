"""The proposer conformance contract (octavo.testing) against n-gram lookup and a draft model
(a second tiny random Llama: same vocabulary, other weights, so drafts are often rejected)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octavo.testing import ProposerContract, write_tiny_llama


class TestNgramProposer(ProposerContract):
    speculative_config = {"method": "ngram", "num_speculative_tokens": 4,
                          "prompt_lookup_min": 2, "prompt_lookup_max": 4}


class TestDraftModelProposer(ProposerContract):
    def make_speculative_config(self, target_model: Path, tmp_path: Path) -> dict[str, Any]:
        draft = write_tiny_llama(tmp_path / "draft", seed=7)
        return {"method": "draft_model", "num_speculative_tokens": 3, "model": str(draft)}
