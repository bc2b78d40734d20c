"""``UniProcExecutor`` (``uni``): the one worker in the engine core's own process.

With async scheduling the worker runs on a thread of its own (``worker-step``), one call
after another in the order they were made: the engine core plans step N+1 and applies
step N-1's output while step N's forward pass runs there (torch releases the GIL in its
kernels). Every call, ``collective_rpc`` too, goes through that thread, so none overtakes
a step in flight.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from octavo.config import EngineConfig
from octavo.executor.base import Executor
from octavo.executor.worker_factory import make_worker
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig, platform: type[Platform],
                 files: ModelFiles) -> None:
        super().__init__(config, platform, files)
        self._thread = (ThreadPoolExecutor(1, thread_name_prefix="worker-step")
                        if config.scheduler.async_scheduling else None)
        if self._thread is None:
            self.worker = _start_worker(config, platform, files)
        else:
            self.worker = self._thread.submit(_start_worker, config, platform, files).result()

    @property
    def max_concurrent_batches(self) -> int:
        """Async scheduling: the step running and the one planned beside it."""
        return 1 if self._thread is None else 2

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        call = getattr(self.worker, method)
        if self._thread is None:
            return [call(*args)]
        return [self._thread.submit(call, *args).result()]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if self._thread is None:
            return self.worker.execute_model(scheduler_output)
        return self._thread.submit(self.worker.execute_model, scheduler_output).result()

    def submit_step(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        if self._thread is None:
            return super().submit_step(scheduler_output)
        return self._thread.submit(self.worker.execute_model, scheduler_output)

    def check_health(self) -> None:
        """The worker lives and dies with this process."""

    def shutdown(self) -> None:
        """Nothing runs beside this process but the step thread, which finishes its
        step."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)


def _start_worker(config: EngineConfig, platform: type[Platform], files: ModelFiles) -> Any:
    """The worker, its model loaded, on the thread that will run its steps. With async
    scheduling that is the ``worker-step`` thread, so the OpenMP thread pool of the model's
    load and warm-up is the one its steps use: a second pool, formed on the engine core's
    thread, would count against the cores and make libgomp's idle threads sleep at once
    instead of spinning (``GOMP_SPINCOUNT``'s throttled count), waking late for each
    parallel region."""
    index, count = config.parallel.node_worker_index(0)
    if count > 1:  # data-parallel engines on this node: each keeps to its own cores
        platform.init_worker_process(index, count)
    return make_worker(config, platform, files)
