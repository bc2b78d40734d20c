"""The free-block queue: a doubly linked list threaded through the blocks themselves.

Why not a ``deque``: a prefix-cache hit must take a free (but still cached) block out of
the *middle* of the queue, and ``deque.remove``/``list.remove`` are O(n). With the links on
the blocks, ``remove`` is O(1). Two sentinel nodes spare every operation the empty-list and
end-of-list special cases.

A third sentinel, the *marker*, splits the queue in two: blocks put in front of it
(``append_before_marker``, and the blocks given to the constructor) are handed out before
every block put at the tail (``append``). The block pool uses it to keep softly reserved
blocks behind the plain free ones but ahead of the cached ones (see ``BlockPool``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from octavo.kv.block import KVBlock


class FreeBlockQueue:
    """Blocks waiting to be (re)allocated; the head is the next one handed out."""

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(block_id=-1)
        self._marker = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._marker
        self._marker.prev_free = self._head
        self._marker.next_free = self._tail
        self._tail.prev_free = self._marker
        self._len = 0
        for block in blocks:
            self.append_before_marker(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVBlock]:
        """Head to tail: the order in which blocks would be handed out."""
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            if node is not self._marker:
                yield node
            node = node.next_free

    def popleft(self) -> KVBlock:
        if self._len == 0:
            raise IndexError("pop from an empty free-block queue")
        block = self._head.next_free
        if block is self._marker:
            block = block.next_free
        assert block is not None
        self.remove(block)
        return block

    def append(self, block: KVBlock) -> None:
        """Put ``block`` at the tail: handed out last."""
        assert self._tail.prev_free is not None
        self._link(block, self._tail.prev_free, self._tail)

    def appendleft(self, block: KVBlock) -> None:
        """Put ``block`` at the head: handed out first."""
        assert self._head.next_free is not None
        self._link(block, self._head, self._head.next_free)

    def append_before_marker(self, block: KVBlock) -> None:
        """Put ``block`` last among the blocks in front of the marker: after every block put
        at the head or here before it, before every block put at the tail."""
        assert self._marker.prev_free is not None
        self._link(block, self._marker.prev_free, self._marker)

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free-block queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def _link(self, block: KVBlock, prev: KVBlock, nxt: KVBlock) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free-block queue")
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self._len += 1
