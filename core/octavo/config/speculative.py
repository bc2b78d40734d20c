"""``SpeculativeConfig``: ``--speculative-config '{"method": "ngram", ...}'`` (vLLM's keys).

Parsed once from the JSON a user types (or the dict ``LLM(speculative_config=...)`` gets);
every error names the offending key. ``method`` names a proposer in the plugin registry;
whether it exists, and whether it needs ``model``, is checked when the engine is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.config.errors import ConfigError
from octavo.config.parse import check_known_keys, check_positive_ints, parse_json_object


class TreeError(ValueError):
    """A token tree that is not one (the message names the node)."""


def tree_paths(paths: Any, max_depth: int) -> tuple[tuple[int, ...], ...]:
    """A token tree's rank paths (``[[0], [1], [0, 0]]``, see ``octavo.spec_decode.tree``) in
    breadth-first order, checked: ranks are non-negative integers, no path is longer than
    ``max_depth`` or repeated, and every path's parent path is in the tree."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise TreeError(f"must be a non-empty list of paths like [[0], [1], [0, 0]], "
                        f"got {paths!r}")
    nodes: list[tuple[int, ...]] = []
    for path in paths:
        if not isinstance(path, (list, tuple)) or not path or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise TreeError(f"node {path!r} is not a non-empty list of ranks >= 0")
        if len(path) > max_depth:
            raise TreeError(f"node {list(path)} is deeper than num_speculative_tokens "
                            f"({max_depth})")
        nodes.append(tuple(path))
    if len(set(nodes)) != len(nodes):
        raise TreeError("a node is listed twice")
    ordered = tuple(sorted(nodes, key=lambda p: (len(p), p)))
    known = set(ordered)
    for path in ordered:
        if len(path) > 1 and path[:-1] not in known:
            raise TreeError(f"node {list(path)} has no parent {list(path[:-1])} in the tree")
    return ordered


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # a proposer's name: ngram, draft_model, medusa, eagle, eagle3, or a plugin's
    num_speculative_tokens: int  # k: most drafts per request and step
    model: str | None = None  # draft model folder (draft_model) or head checkpoint folder
    prompt_lookup_min: int = 2  # ngram: shortest suffix to match
    prompt_lookup_max: int = 5  # ngram: longest suffix to match
    # Tree proposers (Medusa): the candidate paths verified each step, e.g.
    # [[0], [1], [0, 0]] (see octavo.spec_decode.tree); None: a chain of num_speculative_tokens.
    speculative_token_tree: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ConfigError(f"speculative_config: method must name a proposer, "
                              f"got {self.method!r}")
        try:
            check_positive_ints("", num_speculative_tokens=self.num_speculative_tokens,
                                prompt_lookup_min=self.prompt_lookup_min,
                                prompt_lookup_max=self.prompt_lookup_max)
        except ConfigError as exc:
            raise ConfigError(f"speculative_config: {exc}") from None
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative_config: prompt_lookup_min ({self.prompt_lookup_min}) "
                              f"must not exceed prompt_lookup_max ({self.prompt_lookup_max})")
        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError(f"speculative_config: model must be a path, got {self.model!r}")
        if self.speculative_token_tree is not None:
            try:
                tree_paths(self.speculative_token_tree, self.num_speculative_tokens)
            except TreeError as exc:
                raise ConfigError(f"speculative_config: speculative_token_tree: {exc}") from None

    @property
    def max_drafts(self) -> int:
        """Most drafts a request sends to one verification: the tree's nodes, or k."""
        if self.speculative_token_tree is None:
            return self.num_speculative_tokens
        return len(self.speculative_token_tree)

    @classmethod
    def parse(cls, value: str | dict[str, Any] | SpeculativeConfig | None,
              ) -> SpeculativeConfig | None:
        """From JSON text, a dict, or an instance; ``None`` (or empty text) means off."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str) and not value.strip():
            return None
        keys = parse_json_object(value, "speculative_config")
        check_known_keys(keys, cls, "speculative_config")
        for key in ("method", "num_speculative_tokens"):
            if key not in keys:
                raise ConfigError(f"speculative_config: {key!r} is required")
        return cls(**keys)
