"""``StateSlotPool``: the per-request state of a model's SSM layers (Mamba: a convolution's
last inputs and the selective scan's state), one fixed-size slot per running request.

Unlike KV blocks, a state does not grow with the request: a request takes one slot with its
first allocation and gives it back when it is freed (finished, aborted or preempted: a
preempted request recomputes from its first token into a fresh slot). The workers hold a
state tensor per SSM layer with a row per slot; the slot id is all they are told
(``NewRequestData.state_slot``). The engine sizes the pool to ``max_num_seqs``, the most
requests that run at once, so a running request always finds a slot; the pool still says
no when it is empty, and the coordinator then refuses the allocation, changing nothing.
"""

from __future__ import annotations


class StateSlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a state pool needs at least 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._held: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def slot_of(self, request_id: str) -> int | None:
        return self._held.get(request_id)

    def take(self, request_id: str) -> int:
        """The request's slot, taken now if it holds none (``num_free`` must be > 0)."""
        slot = self._held.get(request_id)
        if slot is None:
            if not self._free:
                raise ValueError(f"no state slot is free for request {request_id!r} "
                                 f"({self.num_slots} slots)")
            slot = self._held[request_id] = self._free.pop()
        return slot

    def release(self, request_id: str) -> None:
        slot = self._held.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
