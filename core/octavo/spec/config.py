"""``SpeculativeConfig``: ``--speculative-config '{"method": "ngram", ...}'`` (vLLM's keys).

Parsed once from the JSON a user types (or the dict ``LLM(speculative_config=...)`` gets);
every error names the offending key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from octavo.config import ConfigError
from octavo.spec.tree import DraftTree, TreeError

# Methods and whether they need a "model" (a draft model folder or a head checkpoint).
METHODS = {"ngram": False, "draft_model": True, "medusa": True, "eagle": True, "eagle3": True}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # k: most drafts per request and step
    model: str | None = None  # draft model folder (draft_model) or head checkpoint folder
    prompt_lookup_min: int = 2  # ngram: shortest suffix to match
    prompt_lookup_max: int = 5  # ngram: longest suffix to match
    # Tree proposers (Medusa): the candidate paths verified each step, e.g.
    # [[0], [1], [0, 0]] (see octavo.spec.tree); None: a chain of num_speculative_tokens.
    speculative_token_tree: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"speculative_config: method must be one of "
                              f"{', '.join(METHODS)}; got {self.method!r}")
        for key in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"speculative_config: {key} must be a positive integer, "
                                  f"got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative_config: prompt_lookup_min ({self.prompt_lookup_min}) "
                              f"must not exceed prompt_lookup_max ({self.prompt_lookup_max})")
        if METHODS[self.method] and not self.model:
            raise ConfigError(f"speculative_config: method {self.method!r} needs \"model\" "
                              "(a folder)")
        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError(f"speculative_config: model must be a path, got {self.model!r}")
        if self.speculative_token_tree is not None:
            try:
                DraftTree.from_paths(self.speculative_token_tree, self.num_speculative_tokens)
            except TreeError as exc:
                raise ConfigError(f"speculative_config: speculative_token_tree: {exc}") from None

    @property
    def tree(self) -> DraftTree | None:
        """The draft tree, or None for plain chains of drafts."""
        if self.speculative_token_tree is None:
            return None
        return DraftTree.from_paths(self.speculative_token_tree, self.num_speculative_tokens)

    @property
    def max_drafts(self) -> int:
        """Most drafts a request sends to one verification: the tree's nodes, or k."""
        tree = self.tree
        return len(tree) if tree is not None else self.num_speculative_tokens

    @classmethod
    def parse(cls, value: str | dict[str, Any] | SpeculativeConfig | None,
              ) -> SpeculativeConfig | None:
        """From JSON text, a dict, or an instance; ``None`` (or empty text) means off."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"speculative_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"speculative_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"speculative_config: unknown key {unknown[0]!r}; "
                              f"known: {', '.join(sorted(known))}")
        for key in ("method", "num_speculative_tokens"):
            if key not in value:
                raise ConfigError(f"speculative_config: {key!r} is required")
        return cls(**value)
