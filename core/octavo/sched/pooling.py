"""``PoolingScheduler``: the scheduler of ``--runner pooling``.

Pooling requests are prompts only: they are scheduled as prefills are (whole in one step
where the model cannot take them in chunks, ``SchedulerConfig.enable_chunked_prefill``),
and a request finishes in the step that completes its prompt, with the worker's pooled
vector as its output (``EngineCoreOutput.pooling_output``, finish reason ``stop``). No
token is ever sampled, so none of the generation side (stops, drafts, grammars) runs.
"""

from __future__ import annotations

from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.request import Request, RequestStatus
from octavo.sched.scheduler import Scheduler


class PoolingScheduler(Scheduler):
    def add_request(self, request: Request) -> None:
        if request.pooling_params is None:
            raise ValueError(f"request {request.request_id!r} asks for generation, which this "
                             "engine does not do: it runs the pooling runner (runner=pooling)")
        super().add_request(request)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Finish every request whose prompt this step completed, with its pooled vector."""
        self._release(scheduler_output)
        pooled = dict(zip(model_runner_output.req_ids, model_runner_output.pooler_output))
        outputs: list[EngineCoreOutput] = []
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            if request.num_computed_tokens < request.num_tokens:
                continue  # a chunk of a longer prompt: nothing to report yet
            vector = pooled.get(request_id)
            if vector is None:
                raise RuntimeError(f"the worker pooled nothing for request {request_id!r}, "
                                   "whose prompt this step completed")
            self._finish(request, RequestStatus.FINISHED_STOPPED)
            outputs.append(EngineCoreOutput(
                request_id=request_id, new_token_ids=[],
                finish_reason=RequestStatus.FINISHED_STOPPED.value,
                num_cached_tokens=request.num_cached_tokens, events=request.events,
                pooling_output=vector))
            request.events = []
        return outputs
