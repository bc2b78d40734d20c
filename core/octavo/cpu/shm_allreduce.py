"""``ShmCommunicator``: all-reduce and all-gather through shared memory, for the tensor ranks
of one machine on the CPU.

Each tensor rank is its own process; a decoder layer all-reduces a small activation twice,
so the latency of one call is what matters. gloo goes through loopback TCP (tens of µs and
more a call); here the ranks copy into one shared segment and poll each other's counters.

Segment layout (rank 0 of the group creates it, the others attach by the name it
broadcasts; rank 0 unlinks the name as soon as all have attached, so the mappings live on
but nothing is left in /dev/shm whichever process dies later)::

    [0, size * 64)           one int64 sequence counter per rank, each on its own 64-byte
                             cache line (a rank's stores do not invalidate its peers' lines)
    [size * 64, ...)         data: slots[2][size][stride] bytes, stride = max_bytes rounded
                             up to 64; slots[p][r] is rank r's slot in buffer p

Protocol of call number ``seq`` (1, 2, ... counted by every rank; all_reduce and all_gather
share the count; a call above ``max_bytes`` goes to the fallback and does not count):

1. copy the local tensor into ``slots[seq % 2][rank]``;
2. fence, then store ``seq`` into this rank's counter (the "arrived" signal);
3. wait until every peer's counter is >= ``seq``, then fence;
4. read all slots of ``slots[seq % 2]``: sum them (all_reduce) or concatenate them
   (all_gather) into private memory, which is what the caller gets back.

One barrier a call suffices because the slots are double-buffered by the call's parity. A
rank rewrites the buffer of call ``seq - 1`` at call ``seq + 1``, after passing the barrier
of call ``seq``: every peer has then stored ``seq``, which it does only after it has
finished reading call ``seq - 1``'s buffer. A peer already ahead (its counter at ``seq + 1``,
never more, since passing barrier ``seq + 1`` needs this rank's ``seq + 1``) writes the other
buffer, so the slots a rank reads at call ``seq`` hold call ``seq``'s data.

Summation order: every rank computes ``slot 0 + slot 1 + ... + slot size-1``, in rank order,
from the same bytes, with elementwise adds (no reduction kernel whose order could depend on
the thread count), accumulating 16-bit floats in fp32 and rounding once at the end. The
result is therefore bit-identical on every rank -- the ranks must sample the same tokens --
but it may differ in the last bits from gloo's, whose order is its own.

Memory ordering: the slot bytes are written by torch's copy (possibly on worker threads) and
the counter by a memoryview store, two unrelated native stores. x86 keeps stores in order,
but weakly ordered CPUs (ARM, POWER) may make the counter visible before the data, so a peer
would read a stale slot. A fence between them orders them: Python has no fence primitive,
so, as vLLM's shm_broadcast does, we acquire and release a ``threading.Lock``, whose atomic
read-modify-writes carry full barriers. The reader fences after seeing the counters and
before reading the slots (the acquire side of the same pairing).

Waiting: a rank polls its peers' counters yielding the core (``os.sched_yield``, so a peer
sharing the core can run) for ``_POLL_S``, then sleeps with an exponential back-off up to
``_MAX_SLEEP_S`` so a rank waiting on a slow peer does not burn its core; past ``timeout_s``
it raises a ``RuntimeError`` that names the ranks that never arrived.
"""

from __future__ import annotations

import os
import time
from multiprocessing import shared_memory

import torch
import torch.distributed as dist

from octavo.distributed.state import TensorCommunicator
from octavo.shm import attach_untracked, memory_fence

_LINE = 64  # bytes of a cache line: the counters' spacing and the slots' alignment
_WORDS_PER_LINE = _LINE // 8
_POLL_S = 1e-3  # poll (yielding) this long before sleeping
_FIRST_SLEEP_S = 1e-5
_MAX_SLEEP_S = 1e-3
_ACCUMULATE = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
_MAX_CACHED_VIEWS = 4096  # (parity, dtype, shape) keys; forgotten all at once past this


def _open_segment(group: dist.ProcessGroup, rank_in_group: int,
                  nbytes: int) -> shared_memory.SharedMemory:
    """Collective: rank 0 creates the segment, the others attach; then rank 0 unlinks it."""
    owned = shared_memory.SharedMemory(create=True, size=nbytes) if rank_in_group == 0 else None
    names = [owned.name if owned is not None else None]
    dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
    name = names[0]
    assert name is not None, "rank 0 of the group sent no segment name"
    segment = owned if owned is not None else attach_untracked(name)
    try:
        dist.barrier(group=group)  # every rank has mapped it
    finally:
        if owned is not None:
            owned.unlink()
    return segment


def _sum_in_rank_order(slots: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
    """``out = slots[0] + slots[1] + ...`` in this order; 16-bit floats accumulate in fp32
    (rounded once, at the end), other dtypes in ``out`` itself."""
    wide = _ACCUMULATE.get(out.dtype)
    acc = out if wide is None else torch.empty(out.shape, dtype=wide)
    acc.copy_(slots[0])
    for slot in slots[1:]:
        acc += slot
    return out if wide is None else out.copy_(acc)


class ShmCommunicator:
    """The collectives of one tensor group whose ranks share a machine, through shared memory.

    Tensors above ``max_bytes`` (per rank) go to ``fallback``. Construction is collective
    over ``group``; ``timeout_s`` bounds every wait for a peer. One thread per rank calls
    it (the call count is plain Python state). Implements
    ``octavo.distributed.state.TensorCommunicator``.
    """

    def __init__(self, group: dist.ProcessGroup, rank_in_group: int, size: int, *,
                 max_bytes: int = 4 << 20, fallback: TensorCommunicator,
                 timeout_s: float = 60.0) -> None:
        self.rank = rank_in_group
        self.size = size
        self.max_bytes = max_bytes
        self.fallback = fallback
        self.timeout_s = timeout_s
        stride = -(-max_bytes // _LINE) * _LINE
        self._shm = _open_segment(group, rank_in_group, size * _LINE + 2 * size * stride)
        assert self._shm.buf is not None  # an open segment has its buffer
        self._counters = self._shm.buf.cast("q")
        self._slots = torch.frombuffer(self._shm.buf, dtype=torch.uint8, offset=size * _LINE,
                                       count=2 * size * stride).view(2, size, stride)
        self._peers = [r for r in range(size) if r != rank_in_group]
        self._seq = 0
        self._cached_views: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in rank order, into ``tensor`` (returned)."""
        if tensor.nbytes > self.max_bytes:
            return self.fallback.all_reduce(tensor)
        parity = self._arrive(tensor)
        return _sum_in_rank_order(self._views(parity, tensor), out=tensor)

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in rank order (a new tensor)."""
        if tensor.nbytes > self.max_bytes:
            return self.fallback.all_gather(tensor, dim)
        parity = self._arrive(tensor)
        return torch.cat(self._views(parity, tensor), dim=dim)

    def close(self) -> None:
        """Unmap the segment (its name is long unlinked); the communicator is unusable after."""
        self._counters.release()
        del self._slots, self._cached_views
        self._shm.close()

    def _views(self, parity: int, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The ``size`` slots of buffer ``parity``, each seen as a tensor like ``tensor``.

        Cached: making the views costs more than a small call's copy and sum. Callers hold
        them only in expressions, never across the wait, so that an error raised there
        keeps no view of the segment alive (``close`` could not unmap it).
        """
        key = (parity, tensor.dtype, tensor.shape)
        views = self._cached_views.get(key)
        if views is None:
            if len(self._cached_views) >= _MAX_CACHED_VIEWS:
                self._cached_views.clear()
            flat = self._slots[parity, :, :tensor.nbytes].view(tensor.dtype)
            views = self._cached_views[key] = flat.view(self.size, *tensor.shape).unbind(0)
        return views

    def _arrive(self, tensor: torch.Tensor) -> int:
        """Steps 1-3 of the protocol: post ``tensor``, signal, wait for all; the parity."""
        self._seq += 1
        parity = self._seq % 2
        self._views(parity, tensor)[self.rank].copy_(tensor)
        memory_fence()
        self._counters[self.rank * _WORDS_PER_LINE] = self._seq
        self._wait_for_peers(self._seq)
        memory_fence()
        return parity

    def _wait_for_peers(self, seq: int) -> None:
        """Until every peer's counter reaches ``seq``: poll, then back off; raise past the
        deadline, naming the ranks that have not arrived."""
        late = [r for r in self._peers if self._counters[r * _WORDS_PER_LINE] < seq]
        if not late:
            return
        start = time.monotonic()
        sleep_s = _FIRST_SLEEP_S
        while late:
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise RuntimeError(
                    f"shared-memory collective #{seq} on tensor rank {self.rank}: ranks "
                    f"{late} of the group did not arrive within {self.timeout_s:g} s "
                    f"(a peer died, is stuck, or skipped a collective)")
            if waited < _POLL_S:
                os.sched_yield()
            else:
                time.sleep(sleep_s)
                sleep_s = min(2 * sleep_s, _MAX_SLEEP_S)
            late = [r for r in late if self._counters[r * _WORDS_PER_LINE] < seq]
