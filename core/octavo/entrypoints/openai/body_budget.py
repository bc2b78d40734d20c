"""``BodyBudget``: the bytes of request bodies the server processes at once, bounded, and
the memory their processing took given back to the kernel once the last large one ends.

Why: a body becomes far larger objects while it is processed (the parsed JSON, the prompt's
tokens, the answer). 8 concurrent 8.3 MB ``/tokenize`` calls, each within
``--max-request-body-size``, took the API process to 5-6 GB; beyond the budget
(``--max-inflight-body-size``) a request is answered 503 with Retry-After before its body
is read. And glibc keeps what the processing threads freed in their heaps: the process kept
1.7 -> 3.0 -> 3.4 -> 3.8 -> 3.8 -> 4.0 GB over five such rounds. ``malloc_trim`` returns the
free pages of every heap once no large body is in flight
(tests/e2e/test_serve_memory.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from octavo.host_memory import meminfo_bytes, return_freed_memory

# Bodies at least this large end with a trim of the heaps (when no other one is in flight).
LARGE_BODY_BYTES = 256 << 10
# The default budget: a quarter of the machine's memory over what a body's processing may
# take at its peak: /tokenize on a one-token-per-byte tokenizer (the Rust tokenizer's
# Encoding: each token's text, offsets and masks) took ~170 bytes per body byte at 1 MB and
# ~330 at 8.3 MB; rounded up.
MEMORY_SHARE = 4
MEMORY_PER_BODY_BYTE = 384


def default_inflight_body_size(max_request_body_size: int) -> int:
    """The budget for this host (its memory / 1536, from /proc/meminfo), never below one
    body of the largest size."""
    machine = meminfo_bytes("MemTotal") // (MEMORY_SHARE * MEMORY_PER_BODY_BYTE)
    return max(machine, max_request_body_size)


@dataclass
class BodyBudget:
    """Bytes of request bodies in flight: reserved before (or while) a body is read, released
    when its request's answer is complete. Used on the event loop only."""

    max_bytes: int
    in_flight: int = 0
    large_in_flight: int = 0  # requests in flight with bodies of LARGE_BODY_BYTES or more

    def refusal(self, nbytes: int | None) -> str:
        """The 503's message for a body of ``nbytes`` (None: a chunked body)."""
        body = f"{nbytes} bytes more" if nbytes is not None else "this request's body"
        return (f"the server is processing {self.in_flight} bytes of request bodies; "
                f"{body} would pass the limit of {self.max_bytes} bytes "
                "(--max-inflight-body-size); retry later")


@dataclass
class Reservation:
    """One request's share of the budget: its body's bytes, taken as they are known (the
    declared length at once, a chunked body chunk by chunk) and given back when it ends."""

    budget: BodyBudget
    nbytes: int = 0
    large: bool = False

    def take(self, nbytes: int) -> bool:
        """Add ``nbytes`` (False, adding nothing, when they would pass the budget; a request
        without a body always fits)."""
        budget = self.budget
        if nbytes and budget.in_flight + nbytes > budget.max_bytes:
            return False
        budget.in_flight += nbytes
        self.nbytes += nbytes
        if not self.large and self.nbytes >= LARGE_BODY_BYTES:
            self.large = True
            budget.large_in_flight += 1
        return True

    async def end(self) -> None:
        """Give the bytes back. The last large body to end returns the heaps' free pages
        (off the loop: the trim's time grows with the heaps)."""
        budget = self.budget
        budget.in_flight -= self.nbytes
        self.nbytes = 0
        if self.large:
            self.large = False
            budget.large_in_flight -= 1
            if budget.large_in_flight == 0:
                try:
                    await asyncio.get_running_loop().run_in_executor(None,
                                                                     return_freed_memory)
                except RuntimeError:  # the loop's executor is shut down: the server stops
                    pass
