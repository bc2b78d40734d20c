"""A scheduler that fails on chosen requests, plugged into a real engine core by its
qualified name (``scheduler_cls``) by ``test_engine_step_errors``: the default scheduler,
except that

- a step that holds a request whose id contains ``FAIL_STEP`` raises after the model ran
  (in ``update_from_output``: the workers have already taken the step in), and
- planning raises while a request whose id contains ``FAIL_PLAN`` is in the scheduler.
"""

from __future__ import annotations

from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.sched.scheduler import Scheduler

FAIL_STEP = "fail-step"
FAIL_PLAN = "fail-plan"


class PlantedFailure(RuntimeError):
    """What the failing scheduler raises."""


class FailingScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        if any(FAIL_PLAN in request_id for request_id in self.requests):
            raise PlantedFailure("a planted planning failure")
        return super().schedule()

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        if any(FAIL_STEP in request_id for request_id in scheduler_output.num_scheduled_tokens):
            raise PlantedFailure("a planted sampling failure")
        return super().update_from_output(scheduler_output, model_runner_output)
