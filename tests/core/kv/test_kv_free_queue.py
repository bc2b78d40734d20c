"""The free-block queue against a plain list doing the same operations."""

from __future__ import annotations

import random

import pytest

from octavo.kv.block import KVBlock
from octavo.kv.free_queue import FreeBlockQueue
from octavo.testing.seeds import draw_seed


def _check_links(queue: FreeBlockQueue, expected: list[KVBlock]) -> None:
    forward = list(queue)
    assert [b.block_id for b in forward] == [b.block_id for b in expected]
    assert len(queue) == len(expected)
    for prev, nxt in zip(forward, forward[1:]):
        link = prev.next_free
        assert link is not None
        if link is nxt:
            assert nxt.prev_free is prev
        else:  # the marker sits between them (a sentinel: block id -1)
            assert link.block_id == -1 and link.prev_free is prev and link.next_free is nxt
            assert nxt.prev_free is link


def test_random_operations_match_a_list() -> None:
    seed = draw_seed()
    print(f"seed={seed}")
    rng = random.Random(seed)
    blocks = [KVBlock(i) for i in range(40)]
    queue = FreeBlockQueue(blocks)
    # The model: the blocks in front of the queue's marker, and those behind it.
    front, back = list(blocks), []
    for _ in range(500):
        model = front + back
        outside = [b for b in blocks if b not in model]
        op = rng.choice(["popleft", "remove", "append", "appendleft", "append_before_marker"])
        if op == "popleft" and model:
            assert queue.popleft() is (front or back).pop(0)
        elif op == "remove" and model:
            block = rng.choice(model)
            queue.remove(block)
            (front if block in front else back).remove(block)
        elif op != "popleft" and op != "remove" and outside:
            block = rng.choice(outside)
            getattr(queue, op)(block)
            if op == "append":
                back.append(block)
            else:
                front.insert(0 if op == "appendleft" else len(front), block)
        _check_links(queue, front + back)


def test_misuse_is_refused() -> None:
    a, b = KVBlock(0), KVBlock(1)
    queue = FreeBlockQueue([a])
    with pytest.raises(ValueError, match="block 0 is already in"):
        queue.append(a)
    with pytest.raises(ValueError, match="block 1 is not in"):
        queue.remove(b)
    assert queue.popleft() is a
    with pytest.raises(IndexError, match="empty"):
        queue.popleft()
