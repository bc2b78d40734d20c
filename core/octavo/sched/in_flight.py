"""The scheduler's record of the steps in flight: which requests they hold, and what
async scheduling lets a request in flight do.

With pipeline micro-batches a request is in at most one step in flight. With async
scheduling (``--async-scheduling``) a request may also be in the step scheduled while its
last one runs: the scheduler grants it the position of the token that step will sample
(a placeholder, ``Request.num_output_placeholders``) and the worker, which runs its steps
in order and appends what it samples to its persistent batch, has that token in its row
by the time the next step reads it. A request whose next step needs its last token
before the step is planned waits for its output instead (see ``may_overlap``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from octavo.outputs import SchedulerOutput
from octavo.request import Request


class InFlightRequests:
    """How many steps in flight hold each request."""

    def __init__(self) -> None:
        self._steps: Counter[str] = Counter()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._steps

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, request_ids: Iterable[str]) -> None:
        """One more step holds ``request_ids`` (a step's ``num_scheduled_tokens`` counts
        once per request, whatever its token counts: hence not ``Counter.update``)."""
        for request_id in request_ids:
            self._steps[request_id] += 1

    def release(self, request_ids: Iterable[str]) -> None:
        """One step holding ``request_ids`` is applied (or failed)."""
        for request_id in request_ids:
            left = self._steps[request_id] - 1
            if left > 0:
                self._steps[request_id] = left
            else:
                self._steps.pop(request_id, None)


def may_overlap(request: Request, max_model_len: int, drafts: bool) -> bool:
    """Whether a request in a step in flight may be in the next step too (async
    scheduling). Not when its next step needs the last sampled token to be planned - the
    grammar's bitmask of guided decoding, the drafts of speculative decoding (vLLM defers
    sampling for the former and refuses n-gram drafts; here the request waits for its
    step) - nor when the steps in flight already sample its last token (``max_tokens``,
    ``max_model_len``): a step past them would only be discarded."""
    if drafts or request.sampling_params.structured_outputs is not None:
        return False
    max_tokens = request.sampling_params.max_tokens
    pending = request.num_output_placeholders
    return (request.num_tokens + pending < max_model_len
            and (max_tokens is None or request.num_output_tokens + pending < max_tokens))


def add_placeholders(requests: Iterable[Request]) -> None:
    """After a step is planned: each of its requests whose every known position (placeholders
    included) is now scheduled samples a token in it, which the scheduler learns only when
    the step returns."""
    for request in requests:
        if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
            request.num_output_placeholders += 1


def step_start(scheduler_output: SchedulerOutput, request_id: str) -> int:
    """The first position a step computed for a request (its computed tokens before it):
    with async scheduling the request's own count may already include the next step."""
    cached = scheduler_output.scheduled_cached_reqs
    if request_id in cached.req_ids:
        return cached.num_computed_tokens[cached.req_ids.index(request_id)]
    return next(new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs
                if new.req_id == request_id)
