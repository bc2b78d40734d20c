"""Token-tree attention in the portable backend against a dense reference: a request that
verifies a draft tree sees its cached context and, among its new tokens, only each node's
ancestors - next to prefills, chunks and decodes of the same lengths, which stay causal.
Trees of every size attend as decode rows, past DECODE_QUERY_LIMIT tokens too."""

from __future__ import annotations

import random

import pytest
import torch

from octavo.attention.base import AttentionBackend, TokenTrees
from octavo.spec_decode.tree import DraftTree
from octavo.testing.seeds import draw_seed
from tests.attention_cases import NUM_KV_HEADS, make_case, run_backend

pytestmark = pytest.mark.usefixtures("single_thread")


def random_tree(rng: random.Random, num_nodes: int, depth: int) -> DraftTree:
    """A random prefix-closed tree: each new node extends a random existing path."""
    paths: set[tuple[int, ...]] = set()
    while len(paths) < num_nodes:
        parents = [p for p in paths if len(p) < depth] + [()]
        parent = rng.choice(parents)
        rank = next(r for r in range(num_nodes) if parent + (r,) not in paths)
        paths.add(parent + (rank,))
    return DraftTree.from_paths([list(p) for p in paths], depth)


def test_tree_order_masks_and_paths() -> None:
    tree = DraftTree.from_paths([[1, 0], [0], [0, 0], [1], [0, 0, 0], [0, 1]], 3)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.ranks_per_depth() == [2, 2, 1]
    mask = tree.attention_mask()
    assert mask[6].tolist() == [True, True, False, True, False, False, True]  # (0,0,0)
    assert mask[:3, :3].tolist() == tree.attention_mask(2).tolist()
    # Drafts per node; the target's argmax at the last token, then at each node.
    tokens = [5, 6, 7, 8, 9, 10]
    assert tree.greedy_path(tokens, [6, 0, 9, 0, 0, 0, 0]) == [1, 4]
    assert tree.greedy_path(tokens, [5, 8, 0, 0, 0, 0, 0]) == [0, 3]
    assert tree.greedy_path(tokens, [4, 0, 0, 0, 0, 0, 0]) == []
    assert tree.path_to(5) == [0, 2, 5] and tree.path_to(4) == [1, 4] and tree.path_to(-1) == []
    assert tree.first_choice_path(6) == [0, 2, 5]
    assert tree.first_choice_path(3) == [0, 2]  # cut short by the scheduler
    assert DraftTree.chain(3).is_chain and not tree.is_chain


@pytest.mark.parametrize("paths, message", [
    ([[0], [0, 0, 1]], "no parent"),
    ([[0], [0]], "twice"),
    ([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "deeper than"),
    ([[0], [-1]], "ranks >= 0"),
    ([], "non-empty"),
])
def test_bad_trees_are_named(paths: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftTree.from_paths(paths, 3)


def tree_reference(case, requests, trees: dict[int, DraftTree], scale: float,
                   sliding_window: int | None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """softmax(QK^T)V in fp64 per request; a tree request's query ``i`` sees the context
    and the new tokens its ancestor mask allows, at the tree's positions."""
    outputs, start = [], 0
    for row, ((cached, new), keys, values) in enumerate(zip(requests, case.full_keys,
                                                            case.full_values)):
        query = case.query[start:start + new].double()
        start += new
        group = query.shape[1] // NUM_KV_HEADS
        keys = keys.double().repeat_interleave(group, dim=1)
        values = values.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query, keys) * scale
        key_pos = torch.arange(cached + new)
        if row in trees:
            ancestors = trees[row].attention_mask(new - 1)
            allowed = torch.cat([torch.ones(new, cached, dtype=torch.bool), ancestors], 1)
            key_pos[cached:] = cached + ancestors.sum(1) - 1
            query_pos = key_pos[cached:, None]
        else:
            query_pos = torch.arange(cached, cached + new)[:, None]
            allowed = key_pos[None, :] <= query_pos
        if sliding_window is not None:
            allowed &= key_pos[None, :] > query_pos - sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
    return torch.cat(outputs)


@pytest.mark.parametrize("sliding_window", [None, 2, 9])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_nodes", [(4, 12), (16, 24)], ids=["small", "past-decode-limit"])
def test_tree_requests_match_the_dense_reference(block_size: int, sliding_window: int | None,
                                                 num_nodes: tuple[int, int]) -> None:
    check_tree(draw_seed(), num_nodes, block_size, sliding_window,
               torch.float32, 1e-5)


@pytest.mark.parametrize("num_nodes", [(4, 12), (16, 24)], ids=["small", "past-decode-limit"])
def test_bf16_tree_requests_match_the_dense_reference(num_nodes: tuple[int, int]) -> None:
    """bf16 on the CPU: the fused decode kernel serves the small trees' rows."""
    check_tree(draw_seed(), num_nodes, 16, None, torch.bfloat16, 3e-2)


def check_tree(seed: int, num_nodes: tuple[int, int], block_size: int,
               sliding_window: int | None, dtype: torch.dtype, atol: float) -> None:
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randint(*num_nodes), 4)
    n = len(tree)
    # Tree requests (full and cut short), and causal requests of the very same lengths.
    requests = [(40, 1 + n), (40, 1 + n), (40, 1 + n), (17, 1 + n), (30, 1), (3, 3),
                (rng.randint(1, 60), 4)]
    trees = {0: tree, 1: tree, 6: tree}
    case = make_case(requests, NUM_KV_HEADS * 3, 64, block_size, dtype, seed)
    case.metadata.token_trees = TokenTrees(frozenset(trees), tree.attention_mask())
    out = run_backend(case, NUM_KV_HEADS * 3, 64, sliding_window)
    expected = tree_reference(case, requests, trees, 64**-0.5, sliding_window)
    diff = (out.double() - expected).abs().max().item()
    assert diff < atol, f"seed={seed} max abs diff {diff}"


def test_move_kv_reads_every_source_before_writing() -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, 4, 16, 2, 8, generator=gen)
    before = cache.clone().view(2, -1, 16)
    # Slot 3 is both a destination and the next move's source.
    AttentionBackend.move_kv(cache, torch.tensor([3, 9]), torch.tensor([2, 3]))
    rows = cache.view(2, -1, 16)
    assert torch.equal(rows[:, 2], before[:, 3]) and torch.equal(rows[:, 3], before[:, 9])
    untouched = [s for s in range(64) if s not in (2, 3)]
    assert torch.equal(rows[:, untouched], before[:, untouched]), f"seed={seed}"
