"""``BatchQueue``: the steps the engine core has sent to the executor and not yet applied
(vLLM V1's batch queue), oldest first, at most ``max_concurrent_batches`` of them.

With pipeline stages the ``mp`` executor runs one step per stage at once: while the last
stage computes step N, the first computes step N+1. The engine core schedules a new step
while the queue has room and applies the oldest step's output when it is full (or when
there was nothing new to send), so outputs are applied strictly in step order. The
scheduler keeps a request out of every step after the one it is in until that step's
output is applied (``octavo.sched.scheduler``), so no two steps in flight share a request.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, wait
from dataclasses import dataclass

from octavo.outputs import ModelRunnerOutput, SchedulerOutput


@dataclass
class InFlightStep:
    scheduler_output: SchedulerOutput
    future: Future[ModelRunnerOutput]  # the output rank's answer (``Executor.submit_step``)


class BatchQueue:
    def __init__(self, max_concurrent_batches: int) -> None:
        self.size = max_concurrent_batches
        self._steps: deque[InFlightStep] = deque()

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def full(self) -> bool:
        return len(self._steps) >= self.size

    def push(self, step: InFlightStep) -> None:
        assert not self.full, "a step was sent with max_concurrent_batches already in flight"
        self._steps.append(step)

    def oldest_done(self) -> bool:
        return bool(self._steps) and self._steps[0].future.done()

    def pop_oldest(self) -> InFlightStep:
        return self._steps.popleft()

    def drain(self) -> list[SchedulerOutput]:
        """Wait until every step in flight has answered (or failed) and forget them: what
        a failure calls, so that no future is left running behind the engine's back.
        Their scheduler outputs, oldest first."""
        steps = list(self._steps)
        self._steps.clear()
        wait([step.future for step in steps])
        return [step.scheduler_output for step in steps]

    def request_ids(self) -> list[str]:
        """The requests of every step in flight."""
        return [request_id for step in self._steps
                for request_id in step.scheduler_output.num_scheduled_tokens]
