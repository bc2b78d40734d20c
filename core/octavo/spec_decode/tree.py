"""``DraftTree``: the shape of the drafts a tree proposer (Medusa) sends to be verified.

A chain of ``k`` drafts guesses one continuation. A tree guesses several at once: node
``(r_1, ..., r_d)`` is the draft at depth ``d`` that takes the ``r_d``-th best candidate of
head ``d`` after the path ``(r_1, ..., r_{d-1})`` - Medusa's ``medusa_choices`` and vLLM's
``speculative_token_tree``. Nodes are kept in breadth-first order, so every parent comes
before its children and any prefix of the nodes (the scheduler may cut a request's drafts
short) is a tree too.

The target verifies all nodes in one forward pass: node ``i`` sits at position
``p + depth(i)`` (``p``: the request's last token) and attends the context plus its own
ancestors only (:meth:`attention_mask`). The verifier then follows one path
(:meth:`greedy_path`, :meth:`first_choice_path`) and hands it to the ordinary chain
rejection sampler; the accepted nodes' KV is moved to the positions they now hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from octavo.config.speculative import SpeculativeConfig, tree_paths


@dataclass(frozen=True)
class DraftTree:
    paths: tuple[tuple[int, ...], ...]  # each node's candidate ranks, breadth-first
    parents: np.ndarray  # int64 [N]: parent node index, -1 for the root (the last token)
    depths: np.ndarray  # int64 [N]: 1 for the root's children

    @classmethod
    def from_paths(cls, paths: Any, max_depth: int) -> DraftTree:
        """From a list of rank paths like ``[[0], [1], [0, 0]]``, checked by
        :func:`octavo.config.speculative.tree_paths` (``TreeError`` names the bad node)."""
        ordered = tree_paths(paths, max_depth)
        index = {path: i for i, path in enumerate(ordered)}
        parents = np.array([index[p[:-1]] if len(p) > 1 else -1 for p in ordered],
                           dtype=np.int64)
        return cls(ordered, parents, np.array([len(p) for p in ordered], dtype=np.int64))

    @classmethod
    def of(cls, config: SpeculativeConfig) -> DraftTree | None:
        """The tree of ``speculative_token_tree``, or None for plain chains of drafts."""
        if config.speculative_token_tree is None:
            return None
        return cls.from_paths(config.speculative_token_tree, config.num_speculative_tokens)

    @classmethod
    def chain(cls, length: int) -> DraftTree:
        return cls.from_paths([[0] * d for d in range(1, length + 1)], length)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents.tolist()))

    def ranks_per_depth(self) -> list[int]:
        """How many candidates each depth's head must give (its largest rank + 1)."""
        wanted = [0] * int(self.depths.max())
        for path in self.paths:
            wanted[len(path) - 1] = max(wanted[len(path) - 1], path[-1] + 1)
        return wanted

    def attention_mask(self, num_nodes: int | None = None) -> torch.Tensor:
        """bool ``[1 + n, 1 + n]`` over the request's last token and its first ``n`` nodes:
        True where row ``i`` may attend column ``j`` (``j`` is ``i`` or an ancestor)."""
        n = len(self) if num_nodes is None else num_nodes
        mask = torch.eye(n + 1, dtype=torch.bool)
        mask[:, 0] = True
        for i, parent in enumerate(self.parents[:n].tolist()):
            if parent >= 0:
                mask[i + 1] |= mask[parent + 1]
        return mask

    def children(self, num_nodes: int) -> list[list[int]]:
        """Children of the root (entry 0) and of each of the first ``num_nodes`` nodes
        (entry ``i + 1``), in order."""
        out: list[list[int]] = [[] for _ in range(num_nodes + 1)]
        for i, parent in enumerate(self.parents[:num_nodes].tolist()):
            out[parent + 1].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node`` (-1, the root: none)."""
        path: list[int] = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]

    def greedy_path(self, tokens: list[int], argmax: list[int]) -> list[int]:
        """The nodes greedy decoding accepts: from the root, the child whose draft is the
        target's argmax at the current node, as long as there is one. ``tokens[i]`` is node
        ``i``'s draft; ``argmax[0]`` the target's pick at the last token, ``argmax[i + 1]``
        at node ``i``."""
        children = self.children(len(tokens))
        path: list[int] = []
        current = -1
        while True:
            wanted = argmax[current + 1]
            match = next((c for c in children[current + 1] if tokens[c] == wanted), None)
            if match is None:
                return path
            path.append(match)
            current = match

    def first_choice_path(self, num_nodes: int) -> list[int]:
        """The nodes of the all-best-candidates chain ``(0,), (0, 0), ...``: the draft a
        sampled request verifies. It is fixed before the target runs, so the ordinary
        rejection sampler keeps the target's distribution exactly."""
        children = self.children(num_nodes)
        path: list[int] = []
        current = -1
        while children[current + 1] and self.paths[children[current + 1][0]][-1] == 0:
            current = children[current + 1][0]
            path.append(current)
        return path
